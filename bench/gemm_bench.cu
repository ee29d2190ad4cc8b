// GEMM engine vs cuBLASLt, side by side in one run (bf16 in/out, fp32 accumulation,
// alpha = 1, beta = 0, row-major A[M,K], B as [N,K] (Linear weights) unless --layout kn).
// Inputs rotate over enough operand sets to exceed 3x L2, runs of all variants are
// interleaved, and each variant's median of --reps timed runs is reported. cuBLASLt gets a
// 32 MiB workspace; its heuristic's top candidates are timed and both heuristic #0 and the
// best are reported. Writes JSON (command, commit, device, date) and prints a table.
//
//   bench_gemm_bench [--reps 40] [--layout nk|kn] [--shapes 8192x8192x8192,...]
//                    [--out bench/results/gemm.json] [--commit SHA] [--pipelines]
//                    [--clusters] [--groups G] [--streamk] [--trace] [--b2b N] [--soak S]
//                    [--regstores] [--lend] [--claim] [--carry] [--nostore] [--hint]
//                    [--groupm G] [--legacy]
// --pipelines also times the engine with each shared-memory split forced (GemmArgs::pipeline
// 1 = deep load ring, 2 = wide epilogue staging, 3 = ping-pong consumers: the 'ping' column,
// 4 = ping-pong over whole 128x192 units, D through a small TMA staging: 'ping192'; both also
// checked against cuBLAS on the first operand set), interleaved with the rest; with --groups
// the grouped GEMM with the wide staging, the ping-pong consumers, the 192-column units and the
// carried epilogue too.
// --clusters also times the engine as CTA pairs (GemmArgs::cluster = 2: each B tile loaded
// half by each CTA of a cluster and multicast to both), with --pipelines in each split too,
// the ping-pong consumers included ('ping-pong pairs' line, checked against cuBLAS on the
// first operand set; with --trace also traced, with --soak a window of its own).
// --streamk also times the engine with its stream-K tail (GemmArgs::streamK = 1: the last one
// to two waves split into equal k-step ranges per CTA), interleaved with the rest: a line per
// shape with its fraction of cuBLAS-best ('sk/best') next to the engine's, and its max
// relative difference from cuBLAS on the first operand set (the engine column follows
// MKERNEL_GEMM_STREAMK, so leave that unset to compare).
// --groups G also times the engine's grouped GEMM (GemmArgs::groups, the MoE experts' GEMM):
// G groups of M/G rows each with its own B [N,K] (tile-aligned starts), the same FLOPs as the
// shape, interleaved with the rest (B as [N,K] only: ignored with --layout kn); with --groupm G
// and --hint also grouped with bands of G row blocks, D evict-first, both, and with --claim both
// on claimed tiles (MKERNEL_GEMM_GROUP_BAND / _HINT's choices set explicitly), with --clusters as
// CTA pairs (and with --pipelines the wide staging paired), each checked element by element
// against the grouped default (gemm_bench_grouped.cuh).
// Where the small-K gap goes (session 41; the engine ~10% behind cuBLAS at 8192x8192x1024
// while even at K = 8192):
// --trace runs the engine once more per shape with its timeline stamps (fused/gemm/trace.h) and
// prints the medians per tile: wait for the first stage, main loop, epilogue and its parts;
// the tail, the main loop's share of the span and the SM clock the consumers ran at; then the
// same with the TMA stores issued the other way than the default's (GemmArgs::storeWarps -1:
// store threads at K <= kStoreWarpsMaxK, the consumers above), and with --pipelines the
// ping-pong consumers too (and a ping-pong window in --soak). Every run also times the engine
// with that other setting next to the default: the 'other stores' line, which re-checks the
// rule.
// --regstores also times the engine with its epilogue storing D from the accumulators
// (GemmArgs::regStores = 1: no staging, no TMA store): the default split, the deep ring, the
// 192-column units (pipeline 4) and, with --clusters, the deep ring as CTA pairs, each checked
// against cuBLAS on the first operand set and interleaved with the rest ('register stores' line);
// with --trace the deep ring and its pairs are traced that way too, and with --pipelines the
// 192-column units.
// --lend also times the engine's deep ring lending each tile's last stage to the epilogue
// (GemmArgs::pipeline 5), checked against cuBLAS on the first operand set ('lent stage' line);
// with --trace it is traced beside the deep ring (B [N,K] only: ignored with --layout kn).
// --claim also times the engine on the dynamic tile schedule (GemmArgs::tileClaim: each CTA
// claims its next tile from a counter, zeroed outside the timed window), with --lend the lent
// stage too, checked against cuBLAS ('claimed tiles' line); with --trace both are traced: whether
// the static schedule's uneven CTA ends (the trace's tail) cost what cuBLAS does not lose. With
// --groups the grouped GEMM on claimed tiles too, checked element by element against its static
// walk ('grouped on claimed tiles' line).
// --carry also times the deep ring carrying the second half of each tile's epilogue into the
// next tile's main loop (GemmArgs::pipeline 6), with --claim on claimed tiles too and with
// --clusters as CTA pairs, checked against cuBLAS on the first operand set ('carried epilogue'
// line); with --trace it is traced unpaired (B [N,K] only: ignored with --layout kn).
// --nostore also times the default engine with its store threads issuing no TMA stores
// (GemmArgs::skipStores, a diagnostic: D is left unwritten, so the line has no check): how
// much of the small-K gap the D stores' share of the L2 traffic costs; with --trace it is
// traced too (the static walk).
// --legacy, --hint and --groupm G time the default pipeline with GemmArgs::storeHint and groupM
// set instead of chosen (autoStoreHint, autoGroupM), each checked against cuBLAS on the first
// operand set: --legacy the choice before session 51 (bands of 8, no L2 policy), --hint D's
// stores L2 evict-first with bands of 8, --groupm bands of G without a policy, and both together
// also the two combined. With --trace --hint and --legacy are traced too (bands of 8).
// --b2b N also times N back-to-back calls of the engine and of cuBLAS-best per measurement,
// interleaved with the rest, so that neither's host work per call (the engine encodes tensor
// maps) lands inside the timed window as it may with one call between two events.
// --soak S runs the engine, cuBLAS-best and the engine again for S seconds each and prints each
// window's wall-clock bounds (nvidia-smi's timestamp format) and TFLOP/s: sampled beside it,
// nvidia-smi's SM clock and power tell whether either runs at a lower clock under load; with
// --carry --clusters also a window of the carried epilogue as CTA pairs (multicast halves B's
// L2 reads: does it buy clock under the power cap?).
#include <sys/time.h>
#include <cstdint>
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "bench_args.h"
#include "bench_cuda.cuh"
#include "gemm_bench_grouped.cuh"
#include "gemm_bench_report.cuh"
#include "gemm_bench_util.cuh"
#include "fused/gemm/gemm.h"
#include "fused/gemm/trace.h"

#define CK(x) BENCH_CK(x)
#define CKB(x)                                                                   \
  do {                                                                           \
    cublasStatus_t s_ = (x);                                                     \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                           \
      fprintf(stderr, "%s:%d %s: cublas %d\n", __FILE__, __LINE__, #x, (int)s_); \
      exit(1);                                                                   \
    }                                                                            \
  } while (0)

namespace {

using benchcuda::fillKernel;

using gemmbench::diffKernel;
using gemmbench::L2Variant;
using gemmbench::median;
using gemmbench::report;
using gemmbench::Row;
using gemmbench::Shape;
using gemmbench::wallSeconds;
using gemmbench::wallStamp;

}  // namespace

int main(int argc, char** argv) {
  int reps = 40;
  bool kn = false;
  bool pipes = false;
  bool pairs = false;
  bool streamk = false;
  bool trace = false;
  bool regStores = false;
  bool lend = false;
  bool claim = false;
  bool carry = false;
  bool noStore = false;
  bool hint = false, legacy = false;
  int groupM = 0;
  int b2b = 0;
  double soakS = 0;
  int groups = 0;
  std::string out = "", commit = "unknown";
  std::vector<Shape> shapes = {{8192, 8192, 8192},  {4096, 4096, 4096},  {16384, 8192, 8192},
                               {8192, 28672, 8192}, {8192, 8192, 28672}, {2048, 8192, 8192},
                               {1024, 8192, 8192}};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc)
      reps = atoi(argv[++i]);
    else if (a == "--layout" && i + 1 < argc)
      kn = std::string(argv[++i]) == "kn";
    else if (a == "--out" && i + 1 < argc)
      out = argv[++i];
    else if (a == "--pipelines")
      pipes = true;
    else if (a == "--clusters")
      pairs = true;
    else if (a == "--streamk")
      streamk = true;
    else if (a == "--trace")
      trace = true;
    else if (a == "--regstores")
      regStores = true;
    else if (a == "--lend")
      lend = true;
    else if (a == "--claim")
      claim = true;
    else if (a == "--carry")
      carry = true;
    else if (a == "--nostore")
      noStore = true;
    else if (a == "--hint")
      hint = true;
    else if (a == "--legacy")
      legacy = true;
    else if (a == "--groupm" && i + 1 < argc)
      groupM = atoi(argv[++i]);
    else if (a == "--b2b" && i + 1 < argc)
      b2b = atoi(argv[++i]);
    else if (a == "--soak" && i + 1 < argc)
      soakS = atof(argv[++i]);
    else if (a == "--groups" && i + 1 < argc)
      groups = atoi(argv[++i]);
    else if (a == "--commit" && i + 1 < argc)
      commit = argv[++i];
    else if (a == "--shapes" && i + 1 < argc) {
      shapes.clear();
      std::string s = argv[++i];
      for (const std::string& item : benchargs::splitList(s)) {
        Shape sh;
        if (sscanf(item.c_str(), "%dx%dx%d", &sh.M, &sh.N, &sh.K) == 3) shapes.push_back(sh);
      }
    }
  }
  if (kn) lend = carry = false;  // pipelines 5 and 6 take B [N,K] only
  int dev = 0, sms = 0, l2 = 0;
  CK(cudaSetDevice(dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  sms = prop.multiProcessorCount;
  l2 = prop.l2CacheSize;
  printf("device: %s, %d SMs, L2 %d MB; layout B=%s; reps %d\n", prop.name, sms, l2 >> 20,
         kn ? "[K,N]" : "[N,K]", reps);

  cublasLtHandle_t lt;
  CKB(cublasLtCreate(&lt));
  const size_t wsBytes = 32u << 20;
  void* ws;
  CK(cudaMalloc(&ws, wsBytes));
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t ev[2];
  CK(cudaEventCreate(&ev[0]));
  CK(cudaEventCreate(&ev[1]));

  std::vector<Row> rows;
  for (const Shape& sh : shapes) {
    const size_t bytesA = (size_t)sh.M * sh.K * 2, bytesB = (size_t)sh.N * sh.K * 2;
    const size_t bytesD = (size_t)sh.M * sh.N * 2;
    int sets = (int)std::ceil(3.0 * l2 / (double)(bytesA + bytesB));
    sets = std::max(2, std::min(sets, 16));
    std::vector<void*> A(sets), B(sets);
    for (int i = 0; i < sets; ++i) {
      CK(cudaMalloc(&A[i], bytesA));
      CK(cudaMalloc(&B[i], bytesB));
      fillKernel<<<2048, 256, 0, stream>>>((__nv_bfloat16*)A[i], bytesA / 2, 11 + i);
      fillKernel<<<2048, 256, 0, stream>>>((__nv_bfloat16*)B[i], bytesB / 2, 1000 + i);
    }
    void *D, *Dref;
    CK(cudaMalloc(&D, bytesD));
    CK(cudaMalloc(&Dref, bytesD));

    // cuBLASLt, column-major view: D^T[N,M] = op(B) * A^T.
    cublasLtMatmulDesc_t op;
    CKB(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = kn ? CUBLAS_OP_N : CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    cublasLtMatrixLayout_t la, lb, lc;
    if (kn)
      CKB(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, sh.N, sh.K, sh.N));
    else
      CKB(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, sh.K, sh.N, sh.K));
    CKB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, sh.K, sh.M, sh.K));
    CKB(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, sh.N, sh.M, sh.N));
    cublasLtMatmulPreference_t pref;
    CKB(cublasLtMatmulPreferenceCreate(&pref));
    CKB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &wsBytes, sizeof(wsBytes)));
    cublasLtMatmulHeuristicResult_t heur[8];
    int nAlgos = 0;
    CKB(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 8, heur, &nAlgos));
    const float one = 1.0f, zero = 0.0f;
    int setIdx = 0;
    auto runCublas = [&](int algo, void* dst) {
      const int s = setIdx++ % sets;
      CKB(cublasLtMatmul(lt, op, &one, B[s], la, A[s], lb, &zero, dst, lc, dst, lc,
                         &heur[algo].algo, ws, wsBytes, stream));
    };
    // The dynamic schedule's counters (--claim): one per launch, zeroed before each rep's
    // timed runs; claimNext makes runEngine use the next one.
    constexpr int kClaims = 1024;
    int32_t* dClaims = nullptr;
    int claimIdx = 0;
    bool claimNext = false;
    int skipNext = 0;  // GemmArgs::skipStores of runEngine's next launches (--nostore)
    int hintNext = 0;  // GemmArgs::storeHint of runEngine's next launches (--hint)
    int bandNext = 0;  // GemmArgs::groupM of runEngine's next launches (--groupm)
    if (claim) CK(cudaMalloc(&dClaims, kClaims * sizeof(int32_t)));
    auto zeroClaims = [&] {
      CK(cudaMemsetAsync(dClaims, 0, kClaims * sizeof(int32_t), stream));
      claimIdx = 0;
    };
    auto runEngine = [&](int budget, void* dst, int pipeline = 0, int cluster = 0, int streamK = 0,
                         uint64_t* traceBuf = nullptr, int traceTiles = 0, int traceCtas = 0,
                         int storeWarps = -1, int regSt = 0) {
      const int s = setIdx++ % sets;
      mk::gemm::GemmArgs g;
      g.M = sh.M;
      g.N = sh.N;
      g.K = sh.K;
      g.A = A[s];
      g.B = B[s];
      g.bLayout = kn ? mk::gemm::BLayout::kKN : mk::gemm::BLayout::kNK;
      g.D = dst;
      g.smBudget = budget;
      g.pipeline = pipeline;
      g.cluster = cluster;
      g.streamK = streamK;
      g.trace = traceBuf;
      g.traceTiles = traceTiles;
      g.traceCtas = traceCtas;
      g.storeWarps = storeWarps;
      g.regStores = regSt;
      g.skipStores = skipNext;
      g.storeHint = hintNext;
      g.groupM = bandNext;
      if (claimNext) g.tileClaim = dClaims + claimIdx++ % kClaims;
      if (mk::gemm::launch(g, stream) != ncclSuccess) {
        fprintf(stderr, "engine launch failed\n");
        exit(1);
      }
    };
    auto timeOne = [&](auto&& fn) {
      CK(cudaEventRecord(ev[0], stream));
      fn();
      CK(cudaEventRecord(ev[1], stream));
      CK(cudaEventSynchronize(ev[1]));
      float ms;
      CK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
      return ms;
    };
    // Correctness sanity on set 0: engine vs cuBLAS heuristic #0.
    setIdx = 0;
    runEngine(0, D);
    setIdx = 0;
    runCublas(0, Dref);
    float* dmax;
    CK(cudaMalloc(&dmax, sizeof(float)));
    CK(cudaMemsetAsync(dmax, 0, sizeof(float), stream));
    diffKernel<<<1024, 256, 0, stream>>>((__nv_bfloat16*)D, (__nv_bfloat16*)Dref, bytesD / 2, dmax);
    float hmax = 0;
    CK(cudaMemcpyAsync(&hmax, dmax, sizeof(float), cudaMemcpyDeviceToHost, stream));
    CK(cudaStreamSynchronize(stream));
    // The ping-pong consumers (pipeline 3; with --clusters also as CTA pairs; pipeline 4) on
    // the same set, against the same cuBLAS output.
    auto pingDiff = [&](int cluster, int pipeline = 3, int regSt = 0) {
      setIdx = 0;
      CK(cudaMemsetAsync(D, 0xFF, bytesD, stream));  // poison: NaN where nothing is written
      runEngine(0, D, pipeline, cluster, 0, nullptr, 0, 0, -1, regSt);
      CK(cudaMemsetAsync(dmax, 0, sizeof(float), stream));
      diffKernel<<<1024, 256, 0, stream>>>((__nv_bfloat16*)D, (__nv_bfloat16*)Dref, bytesD / 2,
                                           dmax);
      float h = 0;
      CK(cudaMemcpyAsync(&h, dmax, sizeof(float), cudaMemcpyDeviceToHost, stream));
      CK(cudaStreamSynchronize(stream));
      return h;
    };
    const float hmaxPing = pipes ? pingDiff(1) : 0.0f;
    const float hmaxPingPair = pipes && pairs ? pingDiff(2) : 0.0f;
    const float hmaxPing192 = pipes ? pingDiff(1, 4) : 0.0f;
    const float hmaxLend = lend ? pingDiff(1, 5) : 0.0f;
    // The dynamic schedule: the default pipeline and, with --lend / --carry, pipelines 5 / 6.
    float hmaxClaim = 0.0f;
    if (claim) {
      claimNext = true;
      zeroClaims();
      hmaxClaim = pingDiff(1, 0);
      if (lend) hmaxClaim = std::max(hmaxClaim, pingDiff(1, 5));
      if (carry) hmaxClaim = std::max(hmaxClaim, pingDiff(1, 6));
      claimNext = false;
    }
    // --legacy, --hint, --groupm: the default pipeline with the L2 choices set, not automatic.
    std::vector<L2Variant> l2;
    if (legacy) l2.push_back({"groupM 8, no L2 hint", 2, 8, 0.0, 0.0f});
    if (hint) l2.push_back({"L2 hint (D evict-first), groupM 8", 1, 8, 0.0, 0.0f});
    if (groupM > 0)
      l2.push_back({"groupM " + std::to_string(groupM) + ", no L2 hint", 2, groupM, 0.0, 0.0f});
    if (hint && groupM > 0)
      l2.push_back({"L2 hint + groupM " + std::to_string(groupM), 1, groupM, 0.0, 0.0f});
    std::vector<std::vector<float>> tL2(l2.size());
    for (L2Variant& v : l2) {
      hintNext = v.storeHint;
      bandNext = v.groupM;
      v.maxdiff = pingDiff(1, 0);
    }
    hintNext = bandNext = 0;
    const float hmaxCarry = carry ? std::max(pingDiff(1, 6), pairs ? pingDiff(2, 6) : 0.0f) : 0.0f;
    // The register stores: the worst of the default split, the deep ring, the units and pairs.
    float hmaxReg = 0.0f;
    if (regStores) {
      hmaxReg = std::max({pingDiff(1, 0, 1), pingDiff(1, 1, 1), pingDiff(1, 4, 1)});
      if (pairs) hmaxReg = std::max(hmaxReg, pingDiff(2, 1, 1));
    }
    // The stream-K tail on the same set, against the same cuBLAS output.
    float hmaxSk = 0;
    if (streamk) {
      setIdx = 0;
      CK(cudaMemsetAsync(D, 0xFF, bytesD, stream));  // poison: NaN where nothing is written
      runEngine(0, D, 0, 0, 1);
      CK(cudaMemsetAsync(dmax, 0, sizeof(float), stream));
      diffKernel<<<1024, 256, 0, stream>>>((__nv_bfloat16*)D, (__nv_bfloat16*)Dref, bytesD / 2,
                                           dmax);
      CK(cudaMemcpyAsync(&hmaxSk, dmax, sizeof(float), cudaMemcpyDeviceToHost, stream));
      CK(cudaStreamSynchronize(stream));
    }
    cudaFree(dmax);
    // Pick cuBLAS's best of its heuristic candidates (short timing).
    int bestAlgo = 0;
    double bestMs = 1e30;
    for (int a = 0; a < nAlgos; ++a) {
      std::vector<float> t;
      for (int r = 0; r < 6; ++r) t.push_back(timeOne([&] { runCublas(a, Dref); }));
      const double m = median(t);
      if (m < bestMs) bestMs = m, bestAlgo = a;
    }
    // Warm-up, then interleaved timed runs.
    for (int r = 0; r < 3; ++r) {
      runEngine(0, D);
      runCublas(0, Dref);
    }
    // Grouped (--groups; B [N,K] only): its variants checked against its default here, timed in
    // the rep loop below.
    gemmbench::GroupedBench grouped(sh, kn ? 0 : groups, stream);
    grouped.addVariants(pipes, claim, groupM, hint, pairs);
    grouped.check();
    std::vector<float> tE, tE16, tH0, tBest, tDeep, tWide, tPair, tDeepPair, tWidePair, tPing,
        tPingPair, tSk, tB2bE, tB2bBest, tSwOther, tPing192, tReg, tRegDeep, tRegDeepPair,
        tRegUnits, tLend, tClaim, tClaimLend, tCarry, tClaimCarry, tCarryPair, tNoStore;
    // The storeWarps setting the default (-1) does not pick at this K.
    const int swOther = sh.K <= mk::gemm::kStoreWarpsMaxK ? 0 : 1;
    for (int r = 0; r < reps; ++r) {
      tE.push_back(timeOne([&] { runEngine(0, D); }));
      tSwOther.push_back(timeOne([&] { runEngine(0, D, 0, 0, 0, nullptr, 0, 0, swOther); }));
      tH0.push_back(timeOne([&] { runCublas(0, Dref); }));
      tE16.push_back(timeOne([&] { runEngine(sms - 16, D); }));
      if (bestAlgo != 0) tBest.push_back(timeOne([&] { runCublas(bestAlgo, Dref); }));
      if (pipes) {
        tDeep.push_back(timeOne([&] { runEngine(0, D, 1); }));
        tWide.push_back(timeOne([&] { runEngine(0, D, 2); }));
        tPing.push_back(timeOne([&] { runEngine(0, D, 3); }));
        tPing192.push_back(timeOne([&] { runEngine(0, D, 4); }));
      }
      if (pairs) {
        tPair.push_back(timeOne([&] { runEngine(0, D, 0, 2); }));
        if (pipes) {
          tDeepPair.push_back(timeOne([&] { runEngine(0, D, 1, 2); }));
          tWidePair.push_back(timeOne([&] { runEngine(0, D, 2, 2); }));
          tPingPair.push_back(timeOne([&] { runEngine(0, D, 3, 2); }));
        }
      }
      if (streamk) tSk.push_back(timeOne([&] { runEngine(0, D, 0, 0, 1); }));
      if (lend) tLend.push_back(timeOne([&] { runEngine(0, D, 5); }));
      if (carry) tCarry.push_back(timeOne([&] { runEngine(0, D, 6); }));
      if (carry && pairs) tCarryPair.push_back(timeOne([&] { runEngine(0, D, 6, 2); }));
      if (noStore) {
        skipNext = 1;
        tNoStore.push_back(timeOne([&] { runEngine(0, D); }));
        skipNext = 0;
      }
      for (size_t v = 0; v < l2.size(); ++v) {
        hintNext = l2[v].storeHint;
        bandNext = l2[v].groupM;
        tL2[v].push_back(timeOne([&] { runEngine(0, D); }));
        hintNext = bandNext = 0;
      }
      if (claim) {
        zeroClaims();  // outside the timed windows
        claimNext = true;
        tClaim.push_back(timeOne([&] { runEngine(0, D, 0, 1); }));
        if (lend) tClaimLend.push_back(timeOne([&] { runEngine(0, D, 5, 1); }));
        if (carry) tClaimCarry.push_back(timeOne([&] { runEngine(0, D, 6, 1); }));
        claimNext = false;
      }
      if (regStores) {
        tReg.push_back(timeOne([&] { runEngine(0, D, 0, 0, 0, nullptr, 0, 0, -1, 1); }));
        tRegDeep.push_back(timeOne([&] { runEngine(0, D, 1, 0, 0, nullptr, 0, 0, -1, 1); }));
        tRegUnits.push_back(timeOne([&] { runEngine(0, D, 4, 0, 0, nullptr, 0, 0, -1, 1); }));
        if (pairs)
          tRegDeepPair.push_back(timeOne([&] { runEngine(0, D, 1, 2, 0, nullptr, 0, 0, -1, 1); }));
      }
      if (b2b > 1) {
        tB2bE.push_back(timeOne([&] {
                          for (int i = 0; i < b2b; ++i) runEngine(0, D);
                        }) /
                        b2b);
        tB2bBest.push_back(timeOne([&] {
                             for (int i = 0; i < b2b; ++i) runCublas(bestAlgo, Dref);
                           }) /
                           b2b);
      }
      grouped.timeRep();
    }
    const double flop = 2.0 * sh.M * (double)sh.N * sh.K;
    auto tf = [&](double ms) { return ms > 0 ? flop / (ms * 1e-3) / 1e12 : 0.0; };
    Row row;
    row.s = sh;
    row.eng = tf(median(tE));
    row.eng16 = tf(median(tE16));
    row.swOther = tf(median(tSwOther));
    row.h0 = tf(median(tH0));
    row.best = bestAlgo != 0 ? std::max(row.h0, tf(median(tBest))) : row.h0;
    row.maxdiff = hmax;
    row.deep = tf(median(tDeep));
    row.wide = tf(median(tWide));
    row.ping = tf(median(tPing));
    row.pingMaxdiff = hmaxPing;
    row.ping192 = tf(median(tPing192));
    row.ping192Maxdiff = hmaxPing192;
    row.sk = tf(median(tSk));
    row.skMaxdiff = hmaxSk;
    row.pair = tf(median(tPair));
    row.deepPair = tf(median(tDeepPair));
    row.widePair = tf(median(tWidePair));
    row.pingPair = tf(median(tPingPair));
    row.pingPairMaxdiff = hmaxPingPair;
    row.reg = tf(median(tReg));
    row.regDeep = tf(median(tRegDeep));
    row.regDeepPair = tf(median(tRegDeepPair));
    row.regUnits = tf(median(tRegUnits));
    row.regMaxdiff = hmaxReg;
    row.lend = tf(median(tLend));
    row.lendMaxdiff = hmaxLend;
    row.claim = tf(median(tClaim));
    row.claimLend = tf(median(tClaimLend));
    row.claimMaxdiff = hmaxClaim;
    row.carry = tf(median(tCarry));
    row.claimCarry = tf(median(tClaimCarry));
    row.carryPair = tf(median(tCarryPair));
    row.carryMaxdiff = hmaxCarry;
    row.noStore = tf(median(tNoStore));
    for (size_t v = 0; v < l2.size(); ++v) l2[v].tflops = tf(median(tL2[v]));
    row.l2 = l2;
    grouped.finish(&row);
    row.b2bEng = tf(median(tB2bE));
    row.b2bBest = tf(median(tB2bBest));
    // Traced variants printed after the row: (pipeline, storeWarps, cluster, label, regStores).
    struct TraceVariant {
      int pipeline, storeWarps, cluster;
      const char* label;
      int regSt;
      mk::gemm::TraceSummary s;
      bool claim = false;  // the dynamic schedule (--claim)
      int skip = 0;        // GemmArgs::skipStores (--nostore)
      int storeHint = 0;   // GemmArgs::storeHint (--hint, --legacy; 0: automatic)
      int groupM = 0;      // GemmArgs::groupM (--hint, --legacy; 0: automatic)
    };
    std::vector<TraceVariant> traced;
    if (trace) {
      // The last of three traced runs (the first ones warm the buffers); unpaired, the engine's
      // grid is min(tiles, SMs) on the static schedule, so each CTA walks at most `per` tiles
      // (units of the ping-pong consumers: one a tile per warpgroup); pairs walk pair positions
      // (2 row blocks of one column block), whole pairs of the SMs.
      const int tilesM = (sh.M + mk::gemm::kTileM - 1) / mk::gemm::kTileM;
      const int tilesN = (sh.N + mk::gemm::kTileN - 1) / mk::gemm::kTileN;
      const int tiles = tilesM * tilesN, positions = (tilesM + 1) / 2 * tilesN;
      const int grid = std::min(tiles, sms), per = (tiles + grid - 1) / grid;
      // Room for twice the positions a pair walks on the full grid: the launch cuts the grid
      // to the pairs resident at once (66 of 66 on the H100/H200 so far), and a CTA walking
      // more positions than its records would leave them out of the summary unseen.
      const int gridPair = 2 * std::min(positions, sms / 2);
      const int perPair = 2 * ((positions + gridPair / 2 - 1) / (gridPair / 2));
      // Pipeline 4 (named, or pipeline 0's choice at small K) walks 128x192 or 128x176 units, its
      // producer one record a unit: unpaired variants get room for either walk (the narrower's).
      const int units =
          tilesM * ((sh.N + mk::gemm::kPingUnitNarrowN - 1) / mk::gemm::kPingUnitNarrowN);
      const int gridUnits = std::min(units, sms), perUnit = (units + gridUnits - 1) / gridUnits;
      const int gridOne = std::max(grid, gridUnits);
      // Claimed tiles: a fast CTA may walk more than `per`; room for 4 more.
      const int perOne = std::max(claim ? per + 4 : per, perUnit);
      const size_t words =
          std::max(mk::gemm::traceWords(gridOne, perOne), mk::gemm::traceWords(gridPair, perPair));
      uint64_t* dTrace = nullptr;
      CK(cudaMalloc(&dTrace, words * sizeof(uint64_t)));
      traced = {
          {0, -1, 1, "engine", 0, {}},
          {0, swOther, 1, swOther ? "engine, store threads" : "engine, consumers' stores", 0, {}}};
      if (pipes) traced.push_back({3, 0, 1, "ping-pong", 0, {}});
      if (pipes) traced.push_back({4, 0, 1, "ping-pong 192", 0, {}});
      if (pipes && regStores) traced.push_back({4, 0, 1, "ping-pong 192, register stores", 1, {}});
      if (pipes && pairs) traced.push_back({3, 0, 2, "ping-pong pairs", 0, {}});
      // The cooperative pairs traced with the deep ring only (the traced wide pairs spill), so
      // beside the unpaired deep ring.
      if (pairs) traced.push_back({1, -1, 1, "deep", 0, {}});
      if (pairs) traced.push_back({1, -1, 2, "CTA pairs, deep", 0, {}});
      if (regStores) traced.push_back({1, -1, 1, "deep, register stores", 1, {}});
      if (lend && !pairs) traced.push_back({1, -1, 1, "deep", 0, {}});
      if (lend) traced.push_back({5, -1, 1, "deep, lent stage", 0, {}});
      if (claim) traced.push_back({0, -1, 1, "engine, claimed tiles", 0, {}, true});
      if (claim && lend)
        traced.push_back({5, -1, 1, "deep, lent stage, claimed tiles", 0, {}, true});
      if (carry) traced.push_back({6, -1, 1, "deep, carried epilogue", 0, {}});
      if (claim && carry)
        traced.push_back({6, -1, 1, "carried epilogue, claimed tiles", 0, {}, true});
      if (regStores && pairs)
        traced.push_back({1, -1, 2, "CTA pairs, deep, register stores", 1, {}});
      if (noStore) traced.push_back({0, -1, 1, "engine, D stores off", 0, {}, false, 1});
      if (hint) traced.push_back({0, -1, 1, "engine, L2 hint, groupM 8", 0, {}, false, 0, 1, 8});
      if (legacy)
        traced.push_back({0, -1, 1, "engine, groupM 8, no L2 hint", 0, {}, false, 0, 2, 8});
      for (TraceVariant& v : traced) {
        const int g = v.cluster == 2 ? gridPair : gridOne, n = v.cluster == 2 ? perPair : perOne;
        for (int r = 0; r < 3; ++r) {
          CK(cudaMemsetAsync(dTrace, 0, words * sizeof(uint64_t), stream));
          if (v.claim) zeroClaims();
          claimNext = v.claim;
          skipNext = v.skip;
          hintNext = v.storeHint;
          bandNext = v.groupM;
          runEngine(0, D, v.pipeline, v.cluster, 0, dTrace, n, g, v.storeWarps, v.regSt);
          claimNext = false;
          skipNext = hintNext = bandNext = 0;
        }
        std::vector<uint64_t> hTrace(words);
        CK(cudaMemcpyAsync(hTrace.data(), dTrace, words * sizeof(uint64_t), cudaMemcpyDeviceToHost,
                           stream));
        CK(cudaStreamSynchronize(stream));
        v.s = mk::gemm::summarizeTrace(hTrace, g, n);
      }
      cudaFree(dTrace);
      row.tr = traced[0].s;
    }
    row.nAlgos = nAlgos;
    rows.push_back(row);
    cudaFree(dClaims);  // nullptr without --claim
    printf(
        "  %5d x %5d x %5d: engine %6.1f  engine(%d SMs) %6.1f  cuBLAS h0 %6.1f best %6.1f "
        "(of %d)  ratio %.3f  maxreldiff %.2e  sets %d\n",
        sh.M, sh.N, sh.K, row.eng, sms - 16, row.eng16, row.h0, row.best, nAlgos,
        row.eng / row.best, hmax, sets);
    printf(
        "  %5d x %5d x %5d: other stores (storeWarps %d) %6.1f (%.3f of best; %.3f of "
        "the engine)\n",
        sh.M, sh.N, sh.K, swOther, row.swOther, row.swOther / row.best, row.swOther / row.eng);
    grouped.print(row);
    if (pipes)
      printf(
          "  %5d x %5d x %5d: pipeline deep %6.1f (%.3f of best)  wide %6.1f (%.3f of best)  "
          "ping %6.1f (%.3f of best, maxreldiff %.2e)  ping192 %6.1f (%.3f of best, "
          "maxreldiff %.2e)\n",
          sh.M, sh.N, sh.K, row.deep, row.deep / row.best, row.wide, row.wide / row.best, row.ping,
          row.ping / row.best, row.pingMaxdiff, row.ping192, row.ping192 / row.best,
          row.ping192Maxdiff);
    if (claim)
      printf(
          "  %5d x %5d x %5d: claimed tiles: engine %6.1f (%.3f of best; %.3f of the engine)  "
          "lent stage %6.1f (%.3f of best)  maxreldiff %.2e\n",
          sh.M, sh.N, sh.K, row.claim, row.claim / row.best, row.claim / row.eng, row.claimLend,
          row.claimLend / row.best, row.claimMaxdiff);
    if (carry) {
      // (claimed tiles and CTA pairs only where --claim and --clusters asked for them)
      printf("  %5d x %5d x %5d: carried epilogue %6.1f (%.3f of best; %.3f of the engine)", sh.M,
             sh.N, sh.K, row.carry, row.carry / row.best, row.carry / row.eng);
      if (claim)
        printf("  claimed tiles %6.1f (%.3f of best; %.3f of the engine)", row.claimCarry,
               row.claimCarry / row.best, row.claimCarry / row.eng);
      if (pairs)
        printf("  CTA pairs %6.1f (%.3f of best; %.3f of the engine)", row.carryPair,
               row.carryPair / row.best, row.carryPair / row.eng);
      printf("  maxreldiff %.2e\n", row.carryMaxdiff);
    }
    for (const L2Variant& v : row.l2)
      printf("  %5d x %5d x %5d: %s %6.1f (%.3f of best; %.3f of the engine)  maxreldiff %.2e\n",
             sh.M, sh.N, sh.K, v.label.c_str(), v.tflops, v.tflops / row.best, v.tflops / row.eng,
             v.maxdiff);
    if (noStore)
      printf("  %5d x %5d x %5d: D stores off %6.1f (%.3f of best; %.3f of the engine; no check)\n",
             sh.M, sh.N, sh.K, row.noStore, row.noStore / row.best, row.noStore / row.eng);
    if (lend)
      printf(
          "  %5d x %5d x %5d: lent stage %6.1f (%.3f of best; %.3f of the engine)  maxreldiff "
          "%.2e\n",
          sh.M, sh.N, sh.K, row.lend, row.lend / row.best, row.lend / row.eng, row.lendMaxdiff);
    if (regStores)
      printf(
          "  %5d x %5d x %5d: register stores: engine %6.1f (%.3f of best; %.3f of the engine)  "
          "deep %6.1f (%.3f of best)  pairs deep %6.1f (%.3f of best)  192-column units %6.1f "
          "(%.3f of best)  maxreldiff %.2e\n",
          sh.M, sh.N, sh.K, row.reg, row.reg / row.best, row.reg / row.eng, row.regDeep,
          row.regDeep / row.best, row.regDeepPair, row.regDeepPair / row.best, row.regUnits,
          row.regUnits / row.best, row.regMaxdiff);
    if (streamk)
      printf("  %5d x %5d x %5d: stream-K %6.1f  sk/best %.3f  (engine %.3f)  maxreldiff %.2e\n",
             sh.M, sh.N, sh.K, row.sk, row.sk / row.best, row.eng / row.best, row.skMaxdiff);
    if (b2b > 1)
      printf(
          "  %5d x %5d x %5d: %d back-to-back calls: engine %6.1f  cuBLAS best %6.1f  ratio %.3f\n",
          sh.M, sh.N, sh.K, b2b, row.b2bEng, row.b2bBest, row.b2bEng / row.b2bBest);
    for (const TraceVariant& v : traced) {
      const mk::gemm::TraceSummary& t = v.s;
      const int kSteps = (sh.K + mk::gemm::kTileK - 1) / mk::gemm::kTileK;
      printf(
          "  %5d x %5d x %5d: trace %s: span %.1f us, SM clock %.3f GHz; per %s (median of %d): "
          "first stage %.2f us, main loop %.2f us (%.3f a k-step), epilogue %.2f us; main loop "
          "%.1f%% of the span, main loops' union %.1f%%; starts spread %.1f us, tail %.1f us; "
          "producer lead %.2f us; full waits %.1f%% of the main loops, producer's empty waits "
          "%.1f%% of its loads\n",
          sh.M, sh.N, sh.K, v.label, t.spanUs, t.clockGHz,
          v.pipeline == 3 || v.pipeline == 4 ? "unit" : "tile", t.records, t.firstWaitUs, t.mainUs,
          t.mainUs / kSteps, t.epilogueUs, 100.0 * t.mainFrac, 100.0 * t.busyFrac, t.startSpreadUs,
          t.endSpreadUs, t.producerLeadUs, 100.0 * t.fullWaitFrac, 100.0 * t.emptyWaitFrac);
      if (t.epiRecords > 0)
        printf(
            "  %5d x %5d x %5d: trace %s: epilogue parts (median of %d): staging free %.3f us, "
            "conversions + shared stores %.3f, barrier %.3f, store issue %.3f\n",
            sh.M, sh.N, sh.K, v.label, t.epiRecords, t.epiWaitUs, t.epiWriteUs, t.epiBarUs,
            t.epiIssueUs);
    }
    if (soakS > 0) {
      // Engine, cuBLAS-best, engine: a drift of the clock over time shows as a difference
      // between the two engine windows.
      auto soak = [&](const char* name, auto&& fn) {
        fn();
        CK(cudaStreamSynchronize(stream));
        const std::string from = wallStamp();
        const double t0 = wallSeconds();
        long calls = 0;
        while (wallSeconds() - t0 < soakS) {
          for (int i = 0; i < 20; ++i) fn();
          CK(cudaStreamSynchronize(stream));
          calls += 20;
        }
        const double secs = wallSeconds() - t0;
        printf("  %5d x %5d x %5d: soak %s %ld calls %.1f TFLOP/s from %s to %s\n", sh.M, sh.N,
               sh.K, name, calls, flop * calls / secs / 1e12, from.c_str(), wallStamp().c_str());
        fflush(stdout);
      };
      soak("engine", [&] { runEngine(0, D); });
      soak("cublas_best", [&] { runCublas(bestAlgo, Dref); });
      soak("engine", [&] { runEngine(0, D); });
      if (pipes) soak("ping", [&] { runEngine(0, D, 3); });
      if (pipes && pairs) soak("ping_pairs", [&] { runEngine(0, D, 3, 2); });
      if (carry && pairs) soak("carry_pairs", [&] { runEngine(0, D, 6, 2); });
    }
    if (pairs)
      printf(
          "  %5d x %5d x %5d: CTA pairs %6.1f (%.3f of best; unpaired %.3f)  deep %6.1f  wide "
          "%6.1f\n",
          sh.M, sh.N, sh.K, row.pair, row.pair / row.best, row.eng / row.best, row.deepPair,
          row.widePair);
    if (pairs && pipes)
      printf(
          "  %5d x %5d x %5d: ping-pong pairs %6.1f (%.3f of best; unpaired ping-pong %.3f, "
          "engine %.3f)  maxreldiff %.2e\n",
          sh.M, sh.N, sh.K, row.pingPair, row.pingPair / row.best, row.ping / row.best,
          row.eng / row.best, row.pingPairMaxdiff);
    fflush(stdout);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(op);
    for (int i = 0; i < sets; ++i) {
      cudaFree(A[i]);
      cudaFree(B[i]);
    }
    cudaFree(D);
    cudaFree(Dref);
  }

  return report(rows, sms, kn, reps, out, argc, argv, commit, prop.name);
}
