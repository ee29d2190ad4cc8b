// Stream-K tail of the GEMM engine's static schedule (GemmArgs::streamK): the arithmetic of
// who computes which (tile, k-step), shared by the host (buildParams, unit tests) and the
// kernel (gemm_kernel.cuh), so both sides and the test walk the very same schedule.
//
// Why: the persistent grid walks tiles cta, cta + G, ...; with T tiles on G CTAs and
// T % G != 0 the last wave is partly idle (8192^2 at 128x256: 2048 tiles on 132 CTAs =
// 15.52 waves run as 16 tile-times). Stream-K cuts the tail's k-steps into G equal ranges.
//
// Split rule (CUTLASS-style "last one to two waves stream-K"): with W = T / G full waves and
// T % G != 0, the first (W - 1) * G tiles run data-parallel (every CTA takes W - 1 whole tiles,
// cta, cta + G, ...), and the remaining G + T % G tiles (between one and two waves) are
// linearised tile-major, k-minor into U = (G + T % G) * kIt units (kIt = k-steps per tile)
// cut into G contiguous ranges [c U / G, (c + 1) U / G): every CTA then ends after
// W - 1 + (G + T % G) / G tile-times (plus the fix-up), the fractional T / G instead of W + 1.
// Stream-K only over one to two waves (not over the T % G tiles alone) keeps each range at
// least one tile long (U / G > kIt), so a tile has at most 2 contributors (kSkMaxContrib)
// and each CTA at most one split tile at either end of its range. With T <= G (one wave or
// less: the grid is min(T, budget), so T % G == 0) or T % G == 0 nothing is stream-K.
//
// Contributors of a split tile: the CTA whose range holds the tile's k-step 0 (the tile is the
// last item of its range) is the finisher; every other contributor's part is the first item
// of its own range (it starts past k-step 0), so it stores its partial accumulators early and
// the finisher, reaching the tile last, rarely waits. A CTA has at most one such non-finisher
// part, so the workspace holds one partial per CTA (not per tile): slot = contributor CTA.
#pragma once
#include <cstdint>

#ifdef __CUDACC__
#define MK_SK_HD __host__ __device__ __forceinline__
#else
#define MK_SK_HD inline
#endif

namespace mk {
namespace gemm {

// Most CTAs that compute parts of one tile under the split rule above (sizes nothing: slots
// are per CTA; the unit test checks the bound, and the finisher's wait loop is generic).
constexpr int kSkMaxContrib = 2;

struct SkPlan {
  int32_t tiles = 0;    // T: tiles of the GEMM
  int32_t kIt = 0;      // k-steps per tile
  int32_t grid = 0;     // G: persistent CTAs
  int32_t dpTiles = 0;  // tiles [0, dpTiles) data-parallel (a multiple of grid); the rest stream-K
  int64_t units = 0;    // (tiles - dpTiles) * kIt: stream-K (tile, k-step) units; 0 = none
};

// The plan for T tiles of kIt k-steps on G CTAs (on = GemmArgs::streamK resolved).
MK_SK_HD SkPlan skMakePlan(int32_t tiles, int32_t kIt, int32_t grid, bool on) {
  SkPlan s;
  s.tiles = tiles;
  s.kIt = kIt;
  s.grid = grid;
  s.dpTiles = tiles;
  if (!on || grid <= 0 || kIt <= 0 || tiles <= grid || tiles % grid == 0) return s;
  const int32_t waves = tiles / grid;
  s.dpTiles = (waves - 1) * grid;
  s.units = (int64_t)(tiles - s.dpTiles) * kIt;
  return s;
}

// First stream-K unit of CTA c (c <= grid: c == grid gives the end).
MK_SK_HD int64_t skRangeStart(const SkPlan& s, int32_t c) {
  return (int64_t)c * s.units / s.grid;
}

// A CTA's walk: its data-parallel tiles, then its stream-K range, one item (a tile and its
// k-steps [kBegin, kEnd)) at a time.
struct SkWalk {
  int32_t dpNext;  // next data-parallel tile
  int64_t u, end;  // stream-K units left: [u, end)
};

MK_SK_HD void skWalkBegin(const SkPlan& s, int32_t cta, SkWalk* w) {
  w->dpNext = cta;
  w->u = s.units > 0 ? skRangeStart(s, cta) : 0;
  w->end = s.units > 0 ? skRangeStart(s, cta + 1) : 0;
}

// The next item; false when the CTA is done. kBegin > 0: a non-finisher part (stores its
// partial); kBegin == 0 && kEnd < kIt: the finisher part; else a whole tile.
MK_SK_HD bool skWalkNext(const SkPlan& s, SkWalk* w, int32_t* tile, int32_t* kBegin,
                         int32_t* kEnd) {
  if (w->dpNext < s.dpTiles) {
    *tile = w->dpNext;
    *kBegin = 0;
    *kEnd = s.kIt;
    w->dpNext += s.grid;
    return true;
  }
  if (w->u >= w->end) return false;
  const int64_t t = w->u / s.kIt;
  const int32_t kb = (int32_t)(w->u - t * s.kIt);
  const int64_t left = w->end - w->u;
  const int32_t ke = left < (int64_t)(s.kIt - kb) ? kb + (int32_t)left : s.kIt;
  *tile = s.dpTiles + (int32_t)t;
  *kBegin = kb;
  *kEnd = ke;
  w->u += ke - kb;
  return true;
}

// Contributors of the split tile `tile` whose finisher is CTA `fin`: the CTAs fin + 1, ...,
// whose ranges start inside the tile (each of them has that part as its first item).
// Returns the CTA after the last contributor (the caller walks fin + 1 .. result - 1).
MK_SK_HD int32_t skContribEnd(const SkPlan& s, int32_t fin, int32_t tile) {
  const int64_t tileEnd = (int64_t)(tile - s.dpTiles + 1) * s.kIt;
  int32_t c = fin + 1;
  while (c < s.grid && skRangeStart(s, c) < tileEnd) ++c;
  return c;
}

}  // namespace gemm
}  // namespace mk
