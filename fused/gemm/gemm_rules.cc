// Host-only rules of the GEMM engine: what a call may ask for (canImplement), what the
// automatic settings resolve to (pipeline, tile claims, raster band, store policy), and the
// argument helpers buildParams reads too. No CUDA call anywhere here, so the unit tests run
// every rule on the CPU.
#include <cstdint>
#include <string>

#include "base/can_implement.h"
#include "base/param.h"
#include "fused/gemm/dtype_built.h"
#include "fused/gemm/gemm.h"
#include "fused/gemm/gemm_rules.h"

namespace mk {
namespace gemm {

namespace {

using mk::aligned16;
bool fail(std::string* why, const char* fmt, long long a = 0, long long b = 0) {
  return mk::refuse(why, fmt, a, b);
}

}  // namespace

int64_t effLda(const GemmArgs& a) {
  return a.lda ? a.lda : a.K;
}

int64_t effLdb(const GemmArgs& a) {
  return a.ldb ? a.ldb : (a.bLayout == BLayout::kKN ? a.N : a.K);
}

int64_t effLdd(const GemmArgs& a) {
  return a.ldd ? a.ldd : outCols(a);
}

int64_t effLdc(const GemmArgs& a) {
  return a.ldc ? a.ldc : effLdd(a);
}

// Whether the epilogue can store D through TMA: 16-byte aligned rows, and N itself must end on
// a 16-byte boundary: on the H200 a box clipped at N in the middle of a 16-byte chunk wrote
// zeros to the rest of that chunk (columns N.. of padded rows; seen with N=1030, ldd=1032, see
// gemm-notes). Otherwise the bounds-checked direct epilogue stores it.
bool tmaStorable(const GemmArgs& a) {
  const size_t es = dtypeSize(a.dType);
  return aligned16(a.D) && (effLdd(a) * es) % 16 == 0 && (outCols(a) * es) % 16 == 0;
}

// Where GemmArgs::regStores can store D from the accumulators: 16-byte stores of 8 columns of
// a 16-bit D, which need what the TMA store needs (aligned D, whole 16-byte rows and width);
// nothing read from C, and not the tile-by-tile view.
bool regStorable(const GemmArgs& a) {
  return a.dType != DType::kF32 && a.beta == 0.0f && !a.dTiled && tmaStorable(a);
}

// Elements between two groups' B (GemmGroups::strideB, 0 = packed).
int64_t effStrideB(const GemmArgs& a) {
  if (a.groups.strideB != 0) return a.groups.strideB;
  return (a.bLayout == BLayout::kKN ? (int64_t)a.K : (int64_t)a.N) * effLdb(a);
}

namespace {

// The pipelines whose CTA pairs have a traced kernel (gemm_launch.cuh kTraceable): the deep
// ring and the ping-pong consumers (the traced wide pairs spilled).
bool tracedPairsBuilt(int32_t pipeline) {
  return pipeline == 1 || pipeline == 3;
}

// Whether a call may run as CTA pairs (GemmArgs::cluster): only the static tile walk of the
// stand-alone kernel pairs up, and only the 16-bit-output variants are built paired (traced:
// tracedPairsBuilt). Grouped GEMMs pair up on the cooperative pipelines (a pair's two row
// tiles then lie in one group and share its B: primitives.cuh groupPairTile), not on the
// ping-pong consumers or the carried epilogue (no grouped pair of it is built).
bool pairsAllowed(const GemmArgs& a) {
  const GemmHooks& h = a.hooks;
  return a.dType != DType::kF32 && (a.groups.num == 0 || (a.pipeline != 3 && a.pipeline != 6)) &&
         !a.swiglu && !a.dTiled && (a.trace == nullptr || tracedPairsBuilt(a.pipeline)) &&
         a.pipeline != 4 && a.pipeline != 5 && h.rowReady == nullptr && h.tileDone == nullptr &&
         h.tileOrder == nullptr && h.rowBlockOffset == 0 && a.tileClaim == nullptr &&
         (a.smBudget == 0 || a.smBudget >= 2) &&
         a.streamK != 1;  // an explicit stream-K request wins over MKERNEL_GEMM_CLUSTER
}

}  // namespace

// GemmArgs::cluster resolved (1 or 2); 0 takes MKERNEL_GEMM_CLUSTER where pairs are allowed.
int32_t resolvedCluster(const GemmArgs& a) {
  if (a.cluster != 0) return a.cluster;
  return MK_PARAM_INT(GemmCluster) == 2 && pairsAllowed(a) ? 2 : 1;
}

namespace {

// Whether any fused-operator hook is set (what the plain-GEMM-only variants refuse).
bool anyHook(const GemmHooks& h) {
  return h.rowReady != nullptr || h.tileDone != nullptr || h.tileOrder != nullptr ||
         h.rowBlockOffset != 0 || h.seqBase != nullptr;
}

// The rules of the pipelines built for plain GEMMs first (4: the ping-pong over 192-column units,
// 5: the deep ring lending its last stage to the epilogue, 6: the carried epilogue): 16-bit D;
// no groups (but where `groups`: 4 and 6), SwiGLU, tile-by-tile D, CTA pairs (but where `pairs`),
// stream-K or fused-operator hooks. False with the refusal, naming the pipeline `name`, in *why.
bool plainPipelineOk(const GemmArgs& a, const char* name, std::string* why, bool pairs = false,
                     bool groups = false) {
  const std::string n = name;
  if (a.dType == DType::kF32) return fail(why, (n + " needs a 16-bit output type").c_str());
  if ((a.groups.num != 0 && !groups) || a.swiglu || a.dTiled || (a.cluster == 2 && !pairs) ||
      a.streamK == 1)
    return fail(
        why, (n + (groups ? " runs plain or grouped GEMMs: no" : " runs plain GEMMs: no groups,") +
              " SwiGLU, tile-by-tile D" + (pairs ? "" : ", CTA pairs (cluster=2)") + " or stream-K")
                 .c_str());
  if (anyHook(a.hooks))
    return fail(why, (n + " takes no fused-operator hooks (rowReady, tileDone, tileOrder, "
                          "rowBlockOffset, seqBase)")
                         .c_str());
  return true;
}

// What the stream-K tail cannot be combined with (streamk.h: only the plain static walk of
// the stand-alone kernel has it); nullptr when the call allows it.
const char* streamKConflict(const GemmArgs& a) {
  if (a.groups.num != 0 || a.swiglu) return "streamK runs plain GEMMs (no groups, no SwiGLU)";
  if (a.dTiled) return "streamK takes no tile-by-tile D";
  if (anyHook(a.hooks))
    return "streamK takes no fused-operator hooks (rowReady, tileDone, tileOrder, rowBlockOffset, "
           "seqBase): a split tile has no single producer or publisher";
  if (a.pipeline >= 3)
    return "streamK does not run with the ping-pong consumers (pipeline 3 or 4), the lent "
           "stage (pipeline 5) or the carried epilogue (pipeline 6)";
  if (a.cluster == 2) return "streamK does not run with cluster=2 (CTA pairs)";
  if (a.tileClaim != nullptr) return "streamK walks the static schedule (no tileClaim)";
  if (a.trace != nullptr) return "streamK is not traced (GemmArgs::trace)";
  return nullptr;
}

}  // namespace

// GemmArgs::streamK resolved: 1 on, -1 off, 0 MKERNEL_GEMM_STREAMK where the call allows it.
bool resolvedStreamK(const GemmArgs& a) {
  if (a.streamK != 0) return a.streamK == 1;
  return MK_PARAM_INT(GemmStreamK) == 1 && streamKConflict(a) == nullptr && resolvedCluster(a) == 1;
}

bool canImplement(const GemmArgs& a, std::string* why) {
  if (a.M <= 0 || a.N <= 0 || a.K <= 0)
    return fail(why, "M, N and K must be positive (got M=%lld, N=%lld, ...)", a.M, a.N);
  if (a.K % 8 != 0)
    return fail(why, "K=%lld is not a multiple of 8: TMA needs 16-byte rows for A and B", a.K);
  if (a.abType != DType::kBF16 && a.abType != DType::kF16)
    return fail(why, "A/B type %lld unsupported: inputs must be bf16 or fp16", (int)a.abType);
  if (a.dType != DType::kBF16 && a.dType != DType::kF16 && a.dType != DType::kF32)
    return fail(why, "output type %lld unsupported: bf16, fp16 or fp32", (int)a.dType);
  if (a.bLayout != BLayout::kKN && a.bLayout != BLayout::kNK)
    return fail(why, "B layout %lld unknown", (int)a.bLayout);
  if (!dtypeBuilt(a.abType) || !dtypeBuilt(a.dType))
    return fail(why, "fp16 kernels are not in this build (configured with -DMK_BUILD_F16=OFF)");
  if (a.A == nullptr || a.B == nullptr || a.D == nullptr)
    return fail(why, "A, B and D must not be null");
  if (!aligned16(a.A) || !aligned16(a.B)) return fail(why, "A and B must be 16-byte aligned (TMA)");
  const int64_t lda = effLda(a), ldb = effLdb(a), ldd = effLdd(a);
  if (lda < a.K || lda % 8 != 0)
    return fail(why, "lda=%lld must be >= K=%lld and a multiple of 8 (16-byte rows)", lda, a.K);
  if (a.bLayout == BLayout::kKN && (ldb < a.N || ldb % 8 != 0))
    return fail(why, "B[K,N]: ldb=%lld must be >= N=%lld and a multiple of 8 (16-byte rows)", ldb,
                a.N);
  if (a.bLayout == BLayout::kNK && (ldb < a.K || ldb % 8 != 0))
    return fail(why, "B[N,K]: ldb=%lld must be >= K=%lld and a multiple of 8 (16-byte rows)", ldb,
                a.K);
  if (ldd < outCols(a)) return fail(why, "ldd=%lld must be >= D's width %lld", ldd, outCols(a));
  if (a.beta != 0.0f) {
    if (effLdc(a) < outCols(a))
      return fail(why, "ldc=%lld must be >= D's width %lld", effLdc(a), outCols(a));
  }
  if (a.dTiled && (a.beta != 0.0f || !aligned16(a.D)))
    return fail(why, "a tile-by-tile D needs beta == 0 and a 16-byte aligned D");
  if (a.smBudget < 0) return fail(why, "smBudget=%lld must be >= 0 (0 = all SMs)", a.smBudget);
  if (a.groupM < 0) return fail(why, "groupM=%lld must be >= 0 (0 = automatic)", a.groupM);
  if (a.pipeline < 0 || a.pipeline > 6)
    return fail(why,
                "pipeline=%lld must be 0 (automatic), 1 (deep), 2 (wide), 3 (ping-pong), 4 "
                "(ping-pong, 192-column units), 5 (deep ring, lent stage) or 6 (deep ring, "
                "carried epilogue)",
                a.pipeline);
  if (a.pipeline >= 5) {
    // LendPipe and CarryPipe: GEMMs with B [N,K] (the variants built: plain and unpaired for the
    // lent stage; the carried epilogue also grouped, and as CTA pairs when plain); only the store
    // threads hand the lent stage back (5), or take a carried half's stores inside the next
    // tile's main loop (6), so the consumers may not issue the stores themselves.
    const char* name = a.pipeline == 5 ? "pipeline 5 (deep ring, lent stage)"
                                       : "pipeline 6 (deep ring, carried epilogue)";
    const bool carry = a.pipeline == 6;
    if (carry && a.groups.num != 0 && a.cluster == 2)
      return fail(why,
                  "pipeline 6 (deep ring, carried epilogue) runs grouped GEMMs unpaired: no CTA "
                  "pairs (cluster=2)");
    // The carried epilogue runs as CTA pairs too (cluster=2; the static walk, untraced).
    if (!plainPipelineOk(a, name, why, carry, carry)) return false;
    const std::string n = name;
    if (a.bLayout != BLayout::kNK) return fail(why, (n + " takes B as [N,K] only").c_str());
    if (a.storeWarps == 0 || a.regStores == 1)
      return fail(why, (n + " stores through its store threads: storeWarps 0 and regStores 1 "
                            "do not apply")
                           .c_str());
  }
  if (a.pipeline == 4) {
    // gemm_pingunit.cuh: the static walk of 128x192 units (of the groups' row blocks when
    // grouped), D stored by TMA or, with beta != 0 or regStores 1, from registers.
    if (!plainPipelineOk(a, "pipeline 4 (ping-pong, 192-column units)", why, false, true))
      return false;
    if (a.tileClaim != nullptr)
      return fail(why,
                  "pipeline 4 (ping-pong, 192-column units) walks the static schedule (no "
                  "tileClaim)");
    if (!tmaStorable(a))
      return fail(why,
                  "pipeline 4 (ping-pong, 192-column units) stores D by TMA or 8 columns a "
                  "16-byte store: D 16-byte aligned, ldd and D's width multiples of 16 bytes");
  }
  if (a.pipeline == 3) {
    // What gemm_pingpong.cuh implements; everything else is refused rather than run wrong.
    if (a.dType == DType::kF32)
      return fail(why, "pipeline 3 (ping-pong consumers) needs a 16-bit output type");
    if (a.swiglu) return fail(why, "pipeline 3 (ping-pong consumers) takes no SwiGLU epilogue");
    if (a.dTiled) return fail(why, "pipeline 3 (ping-pong consumers) takes no tile-by-tile D");
    if (a.hooks.tileDone != nullptr)
      return fail(why,
                  "pipeline 3 (ping-pong consumers) takes no tileDone hook (a tile's two halves "
                  "finish in different warpgroups); of the hooks only rowReady, tileOrder, "
                  "rowBlockOffset and seqBase");
    if (a.tileClaim != nullptr)
      return fail(why, "pipeline 3 (ping-pong consumers) walks the static schedule (no tileClaim)");
  }
  if (a.trace != nullptr &&
      (a.groups.num != 0 || a.swiglu || (a.cluster == 2 && !tracedPairsBuilt(a.pipeline))))
    return fail(why,
                "grouped and SwiGLU GEMMs, and CTA pairs other than pipeline 1 (the deep ring) or "
                "3 (ping-pong), are not traced (GemmArgs::trace)");
  if (a.storeWarps < -1 || a.storeWarps > 1)
    return fail(why, "storeWarps=%lld must be -1 (by K), 0 (consumers issue the stores) or 1",
                a.storeWarps);
  if (a.regStores < 0 || a.regStores > 1)
    return fail(why, "regStores=%lld must be 0 (TMA stores) or 1 (stores from registers)",
                a.regStores);
  if (a.skipStores < 0 || a.skipStores > 1)
    return fail(why, "skipStores=%lld must be 0 (D stored) or 1 (a benchmark's diagnostic)",
                a.skipStores);
  if (a.storeHint < 0 || a.storeHint > 2)
    return fail(why,
                "storeHint=%lld must be 0 (automatic), 1 (D's stores L2 evict-first) or 2 (no L2 "
                "policy)",
                a.storeHint);
  if (a.trace != nullptr && (a.traceTiles <= 0 || a.traceCtas <= 0))
    return fail(why, "traceTiles=%lld and traceCtas=%lld must be positive with a trace buffer",
                a.traceTiles, a.traceCtas);
  if (a.streamK < -1 || a.streamK > 1)
    return fail(why, "streamK=%lld must be -1 (off), 0 (MKERNEL_GEMM_STREAMK) or 1 (on)",
                a.streamK);
  if (a.streamK == 1) {
    if (const char* c = streamKConflict(a)) return fail(why, c);
  }
  if (a.cluster < 0 || a.cluster > 2)
    return fail(why, "cluster=%lld must be 0 (MKERNEL_GEMM_CLUSTER), 1 or 2 (CTA pairs)",
                a.cluster);
  if (a.cluster == 2 && a.tileClaim != nullptr)
    return fail(why, "cluster=2 (CTA pairs) walks the static schedule: no tileClaim");
  if (a.cluster == 2 && !pairsAllowed(a))
    return fail(
        why,
        "cluster=2 (CTA pairs) needs a 16-bit D, no SwiGLU, no tile-by-tile D, no "
        "fused-operator hooks, smBudget 0 or >= 2, and grouped GEMMs not on pipeline 3 or 6");
  if (a.pipeline == 2 && a.dType == DType::kF32)
    return fail(why, "pipeline 2 (wide epilogue staging) needs a 16-bit output type");
  if (a.hooks.tileDoneRows && (a.hooks.tileDone == nullptr || a.hooks.seqBase != nullptr))
    return fail(why,
                "hooks.tileDoneRows counts finished tiles per row block from zero: it needs "
                "hooks.tileDone and no hooks.seqBase");
  if (a.hooks.rowReady != nullptr && a.hooks.rowsPerFlag <= 0)
    return fail(why, "hooks.rowsPerFlag=%lld must be positive", a.hooks.rowsPerFlag);
  if (a.swiglu) {
    if (a.groups.num == 0) return fail(why, "the SwiGLU epilogue runs in grouped GEMMs only");
    if (a.bLayout != BLayout::kNK)
      return fail(why, "the SwiGLU epilogue needs B in the [N,K] layout (gate rows, then up)");
    if (a.N % 16 != 0)
      return fail(why, "the SwiGLU epilogue needs N=%lld (2 x the output width) %% 16 == 0", a.N);
    if (a.dType == DType::kF32) return fail(why, "the SwiGLU epilogue stores a 16-bit D");
    if (a.beta != 0.0f) return fail(why, "the SwiGLU epilogue takes no C (beta must be 0)");
  }
  if (a.groups.num != 0) {
    const GemmGroups& g = a.groups;
    if (g.num < 0 || g.num > kMaxGroups)
      return fail(why, "groups.num=%lld must be in 1..%lld", g.num, kMaxGroups);
    if (g.rowStart == nullptr || g.rowCount == nullptr)
      return fail(why, "a grouped GEMM needs groups.rowStart and groups.rowCount (device arrays)");
    if ((a.hooks.tileDone != nullptr && !a.hooks.tileDoneRows) || a.hooks.tileOrder != nullptr ||
        a.hooks.rowBlockOffset != 0 || a.dTiled)
      return fail(why,
                  "a grouped GEMM takes no per-tile hooks (tileDone without tileDoneRows, "
                  "tileOrder, rowBlockOffset) and no tile-by-tile D; of the fused-operator hooks "
                  "rowReady and tileDone in row-count mode");
    const int64_t rows = a.bLayout == BLayout::kKN ? a.K : a.N;
    const int64_t stride = effStrideB(a);
    if (stride < rows * effLdb(a) || stride % 8 != 0)
      return fail(why,
                  "groups.strideB=%lld must be >= one group's B (%lld elements) and a multiple of "
                  "8 (16-byte aligned groups)",
                  stride, rows * effLdb(a));
  }
  return true;
}

// Why 176 where it tiles N exactly: at N 1408 (issue 13's grouped 2048 -> 1408, the small MoE
// model's I; its GEMM1 itself takes SwiGLU, which keeps 192) 192-column units compute 8 x 192 =
// 1536 columns and 256-column tiles 6 x 256 = 1536, a twelfth of zeros either way; 176-column
// units compute none, at 8% less wgmma work a unit. cuBLAS's fastest kernel
// at 8192 x 8192 x 1024 is a ping-pong of 176-column units (session 55). Past the exact fits the
// wider unit keeps its fewer A re-reads.
int32_t unitWidth(const GemmArgs& a) {
  if (a.bLayout != BLayout::kNK || a.swiglu) return kPingUnitN;
  const int64_t setting = MK_PARAM_INT(GemmUnitNarrow);
  const int64_t cols = outCols(a);
  const bool exact = cols % kPingUnitNarrowN == 0 && cols % kPingUnitN != 0;
  return setting == 1 || (setting == 2 && exact) ? kPingUnitNarrowN : kPingUnitN;
}

namespace {

// Whether 128 x unitWidth(a) units load the persistent grid at least as evenly as 128 x kTileN
// tiles (the busiest CTA's columns of D, per 128 rows, under each walk), with work for both
// consumer warpgroups. 8192 x 8192 on 132 CTAs: 21 units (4032 columns) against 16 tiles (4096);
// 4096 x 4096: 6 units (1152) against 4 tiles (1024).
bool unitsFill(const GemmArgs& a, int32_t sms) {
  const int64_t tm = tilesM(a), cols = outCols(a), w = unitWidth(a);
  const int64_t units = tm * ((cols + w - 1) / w);
  const int64_t tiles = tm * ((cols + kTileN - 1) / kTileN);
  // Two units a CTA at least: with one, a warpgroup idles and no epilogue hides under a main loop.
  return units >= 2 * (int64_t)sms &&
         (units + sms - 1) / sms * w <= (tiles + sms - 1) / sms * kTileN;
}

}  // namespace

// Pipeline 0's choice on plain unpaired GEMMs with B [N,K] and a 16-bit D, which pipelines 4, 5
// and 6's rules (canImplement) allow: first the unit walk (below); else MKERNEL_GEMM_AUTO_LEND 2
// (default): the carried epilogue at every K (1.01-1.03x the deep ring at K = 8192 and 28672 on
// claimed tiles, session 49), but the lent stage for beta != 0 (whose epilogue reads C: the carried
// kernel would run the deep ring's two-post epilogue, which waits for its first boxes to be read;
// the lent stage stages the half-tile whole); 1: the lent stage. The lent stage only where the wide
// split ran before (K <= kWideMaxK): past it, never measured.
namespace {

// What every choice of pipeline 0 asks of a call, plain or grouped (the units, the carried
// epilogue, the lent stage): a 16-bit D, no SwiGLU, tile-by-tile D or fused-operator hooks,
// unpaired, no stream-K, and the store settings left to the pipeline (storeWarps not 0, regStores
// 0).
bool autoChoiceFits(const GemmArgs& a) {
  return a.dType != DType::kF32 && !a.swiglu && !a.dTiled && !anyHook(a.hooks) &&
         a.storeWarps != 0 && a.regStores == 0 && resolvedCluster(a) == 1 && !resolvedStreamK(a);
}

// What pipeline 0's unit walk asks of a call besides: a D the TMA can store, no D-store diagnostic
// or explicit L2 policy, beta 0 (its epilogue with C reads it element by element from registers:
// not measured) and no caller's tileClaim (the cooperative walk's).
bool unitWalkFits(const GemmArgs& a) {
  return autoChoiceFits(a) && a.tileClaim == nullptr && a.skipStores != 1 && a.storeHint != 1 &&
         a.beta == 0.0f && tmaStorable(a);
}

// Grouped GEMMs take the unit walk (built in session 57) where MKERNEL_GEMM_GROUP_UNITS allows it,
// with no fill test (the plain rule, unitsFill, would keep tiles at issue 13's shapes by 0.5-2.4%
// of a CTA's columns) and two units a CTA at least, as for plain GEMMs. Setting 2 (the default)
// takes them at K <= kGroupUnitsMaxK and N >= kGroupUnitsMinN, the shapes where they led session
// 61's rounds. At 32 x 4096 rows, 2048 -> 7168: 1.04x the tiles (session 58, H100, bands of 2),
// 1.010x the carried epilogue in session 60's bench --pipelines (H100; 0.993x in two separate
// grouped_bench runs) and 1.022x in session 61 (H200, the same rounds: 680-688 TFLOP/s in every
// round against the carry's 663-669); at 64 x 1024, 1408 -> 2048 (session 61): 1.049x the tiles,
// the default there until then, and 1.006x the carry (which led one round of three). Where they
// lost: K 7168 (7168 -> 2048: 0.93-0.94x the tiles in session 58, 0.989x the carry in session 61)
// and N 1408 (2048 -> 1408: 0.92-0.93x the tiles in session 58, 0.985x the default in session
// 61); between K 2048 and 7168 nothing was measured.
constexpr int64_t kGroupUnitsMaxK = 2048;
constexpr int64_t kGroupUnitsMinN = 2048;

// Both grouped settings read alike: 0 never, 1 wherever the kernel fits, 2 (the default) only on
// the shapes where it was measured ahead (`measuredAhead`).
bool groupSettingWants(int64_t setting, bool measuredAhead) {
  return setting == 1 || (setting == 2 && measuredAhead);
}

bool groupUnitsWanted(const GemmArgs& a) {
  return groupSettingWants(MK_PARAM_INT(GemmGroupUnits),
                           a.K <= kGroupUnitsMaxK && a.N >= kGroupUnitsMinN);
}

// Then the carried epilogue, where MKERNEL_GEMM_GROUP_CARRY allows it: what pipeline 6 implements
// for groups (B [N,K], 16-bit D, unpaired), with its store threads and beta 0 (with C the kernel
// would run its deep-ring epilogue). Setting 2 (the default) takes it where session 60's call A
// (H100, two measures side by side: grouped_bench's rounds against torch, and bench --pipelines'
// lines in one process) put it ahead of the tiles in both: past kWideMaxK (7168 -> 2048, 1.017x,
// where the tiles are the deep ring, as in the plain engine, whose choice the carry is at large
// K) and at N >= kGroupCarryMinN (2048 -> 7168, 1.024x and 1.060x). At 16 x 8192, 2048 -> 1408
// the two measures disagreed (0.90x in grouped_bench, 1.013x in --pipelines), so the tiles stay
// there; between N 1408 and 7168 at K <= kWideMaxK nothing was measured. Setting 2 also wants a D
// the TMA can store, as measured: with another D the carried kernel runs the deep ring's
// epilogue, which would replace the wide staging at K <= kWideMaxK unmeasured.
constexpr int64_t kGroupCarryMinN = 4096;

bool groupCarryWanted(const GemmArgs& a) {
  return groupSettingWants(MK_PARAM_INT(GemmGroupCarry),
                           tmaStorable(a) && (a.K > kWideMaxK || a.N >= kGroupCarryMinN));
}

int autoGroupedPipeline(const GemmArgs& a, int32_t sms) {
  if (sms > 0 && groupUnitsWanted(a) && unitWalkFits(a)) {
    const int64_t w = unitWidth(a);
    const int64_t units = (int64_t)tilesM(a) * ((outCols(a) + w - 1) / w);
    if (units >= 2 * (int64_t)sms) return 4;
  }
  if (groupCarryWanted(a) && autoChoiceFits(a) && a.bLayout == BLayout::kNK && a.beta == 0.0f)
    return 6;
  return 0;
}

}  // namespace

int autoPipeline(const GemmArgs& a, int32_t sms) {
  if (a.pipeline != 0) return 0;
  if (a.groups.num != 0) return autoGroupedPipeline(a, sms);
  if (!autoChoiceFits(a) || a.bLayout != BLayout::kNK) return 0;
  // Why the unit walk at small K (session 56, H100, calls K and L): at 8192 x 8192 x 1024 it ran
  // 0.968 of cuBLAS-best against the carried epilogue's 0.937, at 16384 x 8192 x 1024 0.955
  // against 0.918, at K = 2048 / 4096 0.989 / 0.989 against 0.972 / 0.969; where its units load
  // the grid less evenly (4096 x 4096, 2048 x 8192 at K = 1024) it lost (0.899, 0.927 against
  // 0.928, 0.965), and at K = 8192 it lost at 8192 x 28672 (0.962 against 1.009). With its
  // staged epilogue (session 57, calls C and D) 1.06-1.07 at 8192 x 8192 x 512, 1.01-1.02 at
  // x 1024, 1.00-1.01 at 16384 x 8192 x 1024 and 8192 x 28672 x 1024; still 0.914 against 0.949
  // at 2048 x 8192 x 1024, where units fill the grid less evenly (unitWalkFits: the rest).
  if (sms > 0 && unitWalkFits(a) && a.K <= MK_PARAM_INT(GemmUnitsMaxK) && unitsFill(a, sms))
    return 4;
  int kind = (int)MK_PARAM_INT(GemmAutoLend);
  if (kind == 2 && a.beta != 0.0f) kind = 1;
  if (kind == 1 && a.K > kWideMaxK) kind = 0;
  return kind == 2 ? 6 : (kind == 1 ? 5 : 0);
}

bool autoClaims(const GemmArgs& a, int32_t sms) {
  if (a.pipeline != 0 || a.tileClaim != nullptr || a.trace != nullptr) return false;
  const int resolved = autoPipeline(a, sms);
  // Grouped calls claim only under MKERNEL_GEMM_GROUP_CLAIM (below), but never on the unit walk.
  if ((resolved == 5 || resolved == 6) && a.groups.num == 0) return true;
  if (resolved == 4) return false;  // the unit walk is static
  return a.groups.num != 0 && !anyHook(a.hooks) && MK_PARAM_INT(GemmGroupClaim) != 0 &&
         resolvedCluster(a) == 1;  // CTA pairs walk the static schedule
}

// The L2 choices below leave calls with hooks alone: a fused operator's hooks publish tiles in
// raster order (its communication follows it). Grouped GEMMs take their own settings: their bands
// are cut per group (raster.h) and each group's B is new bytes.

// Why 32 row blocks at K ~ 1024..2048 (session 51, H100): at 8192 x 8192 x 1024 bands of 8 re-read
// all of B (16 MB) eight times while D (128 MB) streams through L2; bands of 32 read it twice
// (1.023-1.028x). At K = 512 no gain, at K >= 4096 the k-loop hides the reloads.
// Grouped calls on the ping-pong consumers (pipeline 3) and on the 192-column units (4; `a` as
// buildParams resolved it) take bands of their own: in session 58's sweeps (H100, issue 13's three
// grouped shapes) the ping-pong ran fastest in bands of 4 and the units in bands of 2 (up to 1.15x
// and 1.08x bands of 8; at 16 x 8192, 2048 -> 1408 the units' bands of 2 and 4 tied within 2%),
// while the tiles showed no trend either way. Why the walks whose CTAs hold two tiles or units at
// once want narrower bands is not established.
int32_t autoGroupM(const GemmArgs& a) {
  if (anyHook(a.hooks)) return 8;
  if (a.groups.num != 0)
    return (int32_t)(a.pipeline == 3   ? MK_PARAM_INT(GemmGroupPingBand)
                     : a.pipeline == 4 ? MK_PARAM_INT(GemmGroupUnitBand)
                                       : MK_PARAM_INT(GemmGroupBand));
  return a.K >= MK_PARAM_INT(GemmBandMinK) && a.K <= MK_PARAM_INT(GemmBandMaxK) ? 32 : 8;
}

// Why only a D larger than the L2 (session 51, H100): there the policy gained 1.013-1.026x at
// 8192 x 8192 x 512 (D 128 MB); with D at 32 MB (4096 x 4096, 2048 x 8192 at K = 1024) the bands
// alone did as well, and a D that fits is worth keeping for its next reader.
int32_t autoStoreHint(const GemmArgs& a, int64_t l2Bytes) {
  const int64_t dBytes = (int64_t)a.M * outCols(a) * (int64_t)dtypeSize(a.dType);
  if (anyHook(a.hooks) || dBytes <= l2Bytes) return 0;
  if (a.groups.num != 0) return MK_PARAM_INT(GemmGroupHint) != 0 ? 1 : 0;
  return a.K <= MK_PARAM_INT(GemmHintMaxK) ? 1 : 0;
}

// The persistent CTAs a call may use: GemmArgs::smBudget, or all `sms` of the device.
int32_t budgetOf(const GemmArgs& a, int32_t sms) {
  return a.smBudget > 0 && a.smBudget < sms ? a.smBudget : sms;
}

}  // namespace gemm
}  // namespace mk
