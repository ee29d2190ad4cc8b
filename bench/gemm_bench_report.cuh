// The GEMM benchmark's per-shape results (bench/gemm_bench.cu, one translation unit) and their
// report: the table, the geomean over the shapes and the JSON file under bench/results/, kept
// apart from the runs and their per-shape lines.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_args.h"
#include "fused/gemm/trace.h"
#include "gemm_bench_util.cuh"

namespace gemmbench {

// One L2 variant of the default pipeline (--legacy, --hint, --groupm): GemmArgs::storeHint and
// groupM set explicitly, against the engine's automatic choice.
struct L2Variant {
  std::string label;
  int storeHint, groupM;
  double tflops;
  float maxdiff;
};

// One shape's TFLOP/s (0 where the variant was not asked for), max relative differences from
// cuBLAS, and the engine's trace summary.
struct Row {
  Shape s;
  double eng, eng16, h0, best, maxdiff, deep, wide, grouped, groupedClaim, groupedWide, groupedPing,
      pair, deepPair, widePair, ping, pingMaxdiff, pingPair, pingPairMaxdiff, sk, skMaxdiff, b2bEng,
      b2bBest, swOther, ping192, ping192Maxdiff, reg, regDeep, regDeepPair, regUnits, regMaxdiff,
      lend, lendMaxdiff, claim, claimLend, claimMaxdiff, carry, claimCarry, carryPair, carryMaxdiff,
      noStore;
  std::vector<L2Variant> l2;
  // The grouped GEMM's (--groups with --groupm / --hint / --clusters).
  std::vector<L2Variant> groupedL2;
  mk::gemm::TraceSummary tr;
  int nAlgos;
};

// Prints the table and the geomean of engine / cuBLAS-best, then writes the JSON (`out`, or a
// timestamped path under bench/results/ when empty); returns main's exit code.
inline int report(const std::vector<Row>& rows, int sms, bool kn, int reps, std::string out,
                  int argc, char** argv, const std::string& commit, const char* device) {
  double lg = 0, minRatio = 1e9, lgH0 = 0;
  for (auto& r : rows) {
    lg += std::log(r.eng / r.best);
    lgH0 += std::log(r.eng / r.h0);
    minRatio = std::min(minRatio, r.eng / r.best);
  }
  const double geo = std::exp(lg / rows.size()), geoH0 = std::exp(lgH0 / rows.size());

  printf(
      "\n| M x N x K | engine TFLOP/s | engine (%d SMs) | cuBLAS h0 | cuBLAS best | engine/best "
      "|\n",
      sms - 16);
  printf("|---|---|---|---|---|---|\n");
  for (auto& r : rows)
    printf("| %dx%dx%d | %.1f | %.1f | %.1f | %.1f | %.3f |\n", r.s.M, r.s.N, r.s.K, r.eng, r.eng16,
           r.h0, r.best, r.eng / r.best);
  printf("geomean engine/cuBLAS-best %.3f (vs heuristic #0 %.3f), min %.3f\n", geo, geoH0,
         minRatio);

  if (out.empty()) out = benchargs::utcNow("bench/results/gemm-%Y%m%d-%H%M%S.json");
  FILE* f = benchargs::openJson(out, "gemm", argc, argv, commit, device, sms);
  if (f == nullptr) return 1;
  fprintf(f, "  \"dtype\": \"bf16\",\n  \"b_layout\": \"%s\",\n  \"reps\": %d,\n", kn ? "KN" : "NK",
          reps);
  fprintf(
      f, "  \"geomean_engine_over_cublas_best\": %.4f,\n  \"min_engine_over_cublas_best\": %.4f,\n",
      geo, minRatio);
  fprintf(f, "  \"geomean_engine_over_cublas_h0\": %.4f,\n  \"results\": [\n", geoH0);
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    auto variants = [](const std::vector<L2Variant>& vs) {
      std::string list;
      for (const L2Variant& v : vs) {
        char one[256];
        snprintf(one, sizeof(one),
                 "%s{\"label\": \"%s\", \"store_hint\": %d, \"group_m\": %d, \"tflops\": "
                 "%.2f, \"max_rel_diff\": %.3e}",
                 list.empty() ? "" : ", ", v.label.c_str(), v.storeHint, v.groupM, v.tflops,
                 v.maxdiff);
        list += one;
      }
      return list;
    };
    const std::string l2 = variants(r.l2), groupedL2 = variants(r.groupedL2);
    fprintf(
        f,
        "    {\"M\": %d, \"N\": %d, \"K\": %d, \"engine_tflops\": %.2f, "
        "\"engine_sms_minus_16_tflops\": %.2f, \"cublas_h0_tflops\": %.2f, "
        "\"cublas_best_tflops\": %.2f, \"cublas_candidates\": %d, \"ratio\": %.4f, "
        "\"max_rel_diff_vs_cublas\": %.3e, \"engine_deep_tflops\": %.2f, "
        "\"engine_wide_tflops\": %.2f, \"engine_grouped_tflops\": %.2f, "
        "\"engine_grouped_claim_tflops\": %.2f, "
        "\"engine_grouped_wide_tflops\": %.2f, \"engine_grouped_ping_tflops\": %.2f, "
        "\"engine_pairs_tflops\": %.2f, \"engine_pairs_deep_tflops\": %.2f, "
        "\"engine_pairs_wide_tflops\": %.2f, \"engine_ping_tflops\": %.2f, "
        "\"ping_max_rel_diff_vs_cublas\": %.3e, \"engine_ping_pairs_tflops\": %.2f, "
        "\"ping_pairs_max_rel_diff_vs_cublas\": %.3e, \"engine_streamk_tflops\": %.2f, "
        "\"streamk_max_rel_diff_vs_cublas\": %.3e, \"b2b_engine_tflops\": %.2f, "
        "\"b2b_cublas_best_tflops\": %.2f, \"engine_other_stores_tflops\": %.2f, "
        "\"engine_ping192_tflops\": %.2f, \"ping192_max_rel_diff_vs_cublas\": %.3e, "
        "\"engine_reg_stores_tflops\": %.2f, \"engine_reg_stores_deep_tflops\": %.2f, "
        "\"engine_reg_stores_pairs_deep_tflops\": %.2f, \"engine_reg_stores_units_tflops\": %.2f, "
        "\"reg_stores_max_rel_diff\": %.3e, "
        "\"engine_lend_tflops\": %.2f, \"lend_max_rel_diff\": %.3e, "
        "\"engine_claim_tflops\": %.2f, \"engine_claim_lend_tflops\": %.2f, "
        "\"claim_max_rel_diff\": %.3e, \"engine_carry_tflops\": %.2f, "
        "\"engine_claim_carry_tflops\": %.2f, \"engine_carry_pairs_tflops\": %.2f, "
        "\"carry_max_rel_diff\": %.3e, \"engine_no_store_tflops\": %.2f, "
        "\"l2_variants\": [%s], \"grouped_l2_variants\": [%s], "
        "\"trace\": {\"records\": %d, \"span_us\": %.2f, "
        "\"sm_clock_ghz\": %.4f, \"first_stage_us\": %.3f, \"main_loop_us\": %.3f, "
        "\"epilogue_us\": %.3f, \"main_loop_share\": %.4f, \"start_spread_us\": %.2f, "
        "\"tail_us\": %.2f, \"producer_lead_us\": %.3f, \"main_loops_union\": %.4f, "
        "\"epi_records\": %d, \"epi_staging_free_us\": %.3f, \"epi_write_us\": %.3f, "
        "\"epi_barrier_us\": %.3f, \"epi_issue_us\": %.3f, \"full_wait_frac\": %.4f, "
        "\"empty_wait_frac\": %.4f}}%s\n",
        r.s.M, r.s.N, r.s.K, r.eng, r.eng16, r.h0, r.best, r.nAlgos, r.eng / r.best, r.maxdiff,
        r.deep, r.wide, r.grouped, r.groupedClaim, r.groupedWide, r.groupedPing, r.pair, r.deepPair,
        r.widePair, r.ping, r.pingMaxdiff, r.pingPair, r.pingPairMaxdiff, r.sk, r.skMaxdiff,
        r.b2bEng, r.b2bBest, r.swOther, r.ping192, r.ping192Maxdiff, r.reg, r.regDeep,
        r.regDeepPair, r.regUnits, r.regMaxdiff, r.lend, r.lendMaxdiff, r.claim, r.claimLend,
        r.claimMaxdiff, r.carry, r.claimCarry, r.carryPair, r.carryMaxdiff, r.noStore, l2.c_str(),
        groupedL2.c_str(), r.tr.records, r.tr.spanUs, r.tr.clockGHz, r.tr.firstWaitUs, r.tr.mainUs,
        r.tr.epilogueUs, r.tr.mainFrac, r.tr.startSpreadUs, r.tr.endSpreadUs, r.tr.producerLeadUs,
        r.tr.busyFrac, r.tr.epiRecords, r.tr.epiWaitUs, r.tr.epiWriteUs, r.tr.epiBarUs,
        r.tr.epiIssueUs, r.tr.fullWaitFrac, r.tr.emptyWaitFrac, i + 1 < rows.size() ? "," : "");
  }
  fprintf(f, "  ]\n}\n");
  fclose(f);
  printf("wrote %s\n", out.c_str());
  return 0;
}

}  // namespace gemmbench
