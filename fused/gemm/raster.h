// The tile schedule's raster arithmetic: the grouped raster of an ordinary GEMM, and the walk of
// a grouped GEMM's groups. Shared by the kernel (primitives.cuh) and the unit test
// (tests/unit/test_gemm_raster.cc), so both walk the very same mapping.
#pragma once
#include <cstdint>

#ifdef __CUDACC__
#define MK_RASTER_HD __host__ __device__ __forceinline__
#else
#define MK_RASTER_HD inline
#endif

namespace mk {
namespace gemm {

// The grouped raster: tile t of a tilesM x tilesN grid, bands of groupM row blocks walked column
// by column (the last band holds what is left), so CTAs running at the same time share a few A
// row blocks and a band of B columns in L2.
MK_RASTER_HD void rasterCoords(int32_t tilesM, int32_t tilesN, int32_t groupM, int32_t t,
                               int32_t* mBlk, int32_t* nBlk) {
  const int32_t perGroup = groupM * tilesN;
  const int32_t group = t / perGroup;
  const int32_t first = group * groupM;
  const int32_t size = groupM < tilesM - first ? groupM : tilesM - first;
  const int32_t r = t - group * perGroup;
  *mBlk = first + r % size;
  *nBlk = r / size;
}

// The group owning virtual row block vBlk of a grouped GEMM (prefix[g] = row blocks of groups
// before g, prefix[num] the total): the last group whose first block is <= vBlk (an empty
// group's first block is its successor's, so the search skips it).
MK_RASTER_HD int32_t groupOfBlock(int32_t num, const int32_t* prefix, int32_t vBlk) {
  int32_t lo = 0, hi = num - 1;
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) >> 1;
    if (prefix[mid] <= vBlk) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// Tile t < prefix[num] * tilesN of a grouped GEMM: its group g, row block blk within the group
// and column block nBlk. raster 1 (GemmParams::grpRaster, the default): group g's tiles are
// [prefix[g], prefix[g+1]) * tilesN, walked with the grouped raster inside the group, so a band
// never holds rows of two groups. raster 0: the groups' row blocks as one virtual column, one
// raster over all of it (a band may span groups).
// Why raster 1: at few row blocks a group (MoE experts at ~512 rows) a band of groupM blocks
// spans two or more experts' weights, and a small grid (a rank's share of a shared GPU) walks
// such a band a few columns at a time. Measured on the H200 with 4 ranks sharing it (64 experts
// of 512 rows a rank, K 7168, N 4096; session 28): the sequential grouped GEMMs on the ranks'
// shares 22.1 -> 14.7 ms, the fused dispatch + GEMM 19.1 -> 15.1 ms; the grouped GEMM alone on
// the whole GPU unchanged (0.988 / 0.990 of the plain engine).
MK_RASTER_HD void groupTileCoords(int32_t num, const int32_t* prefix, int32_t tilesN,
                                  int32_t groupM, int32_t raster, int32_t t, int32_t* g,
                                  int32_t* blk, int32_t* nBlk) {
  if (raster != 0) {
    *g = groupOfBlock(num, prefix, t / tilesN);
    rasterCoords(prefix[*g + 1] - prefix[*g], tilesN, groupM, t - prefix[*g] * tilesN, blk, nBlk);
  } else {
    int32_t vBlk;
    rasterCoords(prefix[num], tilesN, groupM, t, &vBlk, nBlk);
    *g = groupOfBlock(num, prefix, vBlk);
    *blk = vBlk - prefix[*g];
  }
}

}  // namespace gemm
}  // namespace mk
