// FlatPool (parallel/zero/flat_pool.h): stage 3's allocator of unit flats. The expectations are
// closed forms in pages (what is in use, kept and mapped after each call) and the kernel's own
// word on whether an address is mapped (mincore fails with ENOMEM on an unmapped page).
#include <ATen/native/Resize.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "parallel/zero/flat_pool.h"

namespace krab::parallel::zero {
namespace {

const int64_t kPage = ::sysconf(_SC_PAGESIZE);

bool mapped(const void* p) {
  unsigned char v = 0;
  return ::mincore(const_cast<void*>(p), static_cast<size_t>(kPage), &v) == 0;
}

TEST(FlatPool, AFreedBlockIsReusedForTheSameSizeWithoutANewMapping) {
  FlatPool pool;
  void* first = nullptr;
  {
    c10::DataPtr a = pool.allocate(3 * kPage - 5);  // rounded up to 3 pages
    ASSERT_NE(a.get(), nullptr);
    std::memset(a.get(), 7, 3 * kPage - 5);
    first = a.get();
    EXPECT_EQ(pool.in_use_bytes(), 3 * kPage);
    EXPECT_EQ(pool.kept_bytes(), 0);
  }
  EXPECT_EQ(pool.in_use_bytes(), 0);
  EXPECT_EQ(pool.kept_bytes(), 3 * kPage);
  EXPECT_TRUE(mapped(first));
  c10::DataPtr b = pool.allocate(3 * kPage);
  EXPECT_EQ(b.get(), first);
  EXPECT_EQ(pool.mappings(), 1);
  EXPECT_EQ(pool.kept_bytes(), 0);
  c10::DataPtr c = pool.allocate(kPage);  // another size: a new mapping, which reads as zeros
  EXPECT_EQ(pool.mappings(), 2);
  EXPECT_EQ(static_cast<const unsigned char*>(c.get())[kPage - 1], 0);
  EXPECT_EQ(pool.allocate(0).get(), nullptr);
  EXPECT_EQ(pool.mappings(), 2);
}

// in_use + kept never exceeds the most in use at once: a new size evicts kept blocks, oldest
// first, until it fits under that bound again.
TEST(FlatPool, KeptBytesStayWithinThePeakInUse) {
  FlatPool pool;
  void *one = nullptr, *two = nullptr;
  {
    c10::DataPtr a = pool.allocate(kPage), b = pool.allocate(2 * kPage);
    one = a.get();
    two = b.get();
  }
  EXPECT_EQ(pool.peak_in_use_bytes(), 3 * kPage);
  EXPECT_EQ(pool.kept_bytes(), 3 * kPage);
  {
    c10::DataPtr c = pool.allocate(2 * kPage);  // b's block again: nothing evicted
    EXPECT_EQ(c.get(), two);
    EXPECT_EQ(pool.kept_bytes(), kPage);
    c10::DataPtr d = pool.allocate(4 * kPage);  // in use 6 pages: the new peak; a's block goes
    EXPECT_EQ(pool.peak_in_use_bytes(), 6 * kPage);
    EXPECT_EQ(pool.kept_bytes(), 0);
    EXPECT_FALSE(mapped(one));
  }
  EXPECT_EQ(pool.kept_bytes(), 6 * kPage);
  c10::DataPtr e = pool.allocate(5 * kPage);  // in use 5 + kept 6 > 6: both kept blocks go
  EXPECT_EQ(pool.kept_bytes(), 0);
  EXPECT_FALSE(mapped(two));
  EXPECT_EQ(pool.in_use_bytes() + pool.kept_bytes(), 5 * kPage);
  EXPECT_LE(pool.in_use_bytes() + pool.kept_bytes(), pool.peak_in_use_bytes());
}

// With a block size, every request up to it gets a block of that size, so any kept block
// serves it; a larger request gets a block of its own size.
TEST(FlatPool, BlocksHaveAtLeastTheBlockSize) {
  FlatPool pool(4 * kPage);
  void* first = nullptr;
  {
    c10::DataPtr a = pool.allocate(kPage);
    first = a.get();
    EXPECT_EQ(pool.in_use_bytes(), 4 * kPage);
  }
  c10::DataPtr b = pool.allocate(3 * kPage + 1);
  EXPECT_EQ(b.get(), first);
  c10::DataPtr c = pool.allocate(6 * kPage);
  EXPECT_EQ(pool.mappings(), 2);
  EXPECT_EQ(pool.in_use_bytes(), 10 * kPage);
}

// Stage 3's order for four units of different sizes (a CNN: two small layers, one large, one
// small) with prefetch 1: forward gathers a unit and the next, frees each after it ran, keeps
// the last; backward gathers each and the one before it. With blocks of the largest unit's
// size two blocks serve them all: after the first step no gather maps anything.
TEST(FlatPool, UnitsOfDifferentSizesReuseBlocksStepAfterStep) {
  FlatPool pool(393 * kPage);
  const int64_t pages[4] = {1, 19, 393, 1};
  c10::DataPtr flat[4];
  auto gather = [&](int u) { flat[u] = pool.allocate(pages[u] * kPage); };
  auto free = [&](int u) { flat[u].clear(); };
  int64_t after_first = 0;
  for (int step = 0; step < 4; ++step) {
    gather(0), gather(1), free(0), gather(2), free(1), gather(3), free(2);  // forward
    gather(2), free(3), gather(1), free(2), gather(0), free(1), free(0);    // backward
    if (step == 0) after_first = pool.mappings();
    EXPECT_EQ(pool.mappings(), after_first) << "step " << step;
    EXPECT_EQ(pool.in_use_bytes(), 0);
    EXPECT_LE(pool.kept_bytes(), pool.peak_in_use_bytes());
  }
  EXPECT_EQ(after_first, 2);
  EXPECT_EQ(pool.peak_in_use_bytes(), 2 * 393 * kPage);
}

TEST(FlatPool, ReleaseUnmapsKeptBlocksAndABlockMayOutliveItsPool) {
  c10::DataPtr survivor;
  void* kept = nullptr;
  {
    FlatPool pool;
    {
      c10::DataPtr a = pool.allocate(kPage);
      kept = a.get();
    }
    pool.release_kept();
    EXPECT_EQ(pool.kept_bytes(), 0);
    EXPECT_FALSE(mapped(kept));
    survivor = pool.allocate(2 * kPage);
  }
  static_cast<char*>(survivor.get())[0] = 1;  // still mapped after the pool
  void* p = survivor.get();
  survivor.clear();  // unmapped by its deleter: no pool to keep it
  EXPECT_FALSE(mapped(p));
}

// What Stage3Storage does: a resizable storage naming the pool; resizing to 0 frees the block
// (the tensor keeps its shape, its data is gone) and resizing back reuses it.
TEST(FlatPool, ServesAStorageResizedToZeroAndBack) {
  FlatPool pool;
  at::Tensor t = torch::zeros({3000});
  auto* impl = t.storage().unsafeGetStorageImpl();
  impl->set_allocator(&pool);
  at::native::resize_bytes_cpu(impl, 3000 * 4);  // the first block of the pool
  t.fill_(2.0f);
  void* first = t.data_ptr();
  at::native::resize_bytes_cpu(impl, 0);
  EXPECT_EQ(t.storage().data(), nullptr);
  EXPECT_EQ(t.numel(), 3000);
  EXPECT_EQ(pool.kept_bytes(), (3000 * 4 + kPage - 1) / kPage * kPage);
  at::native::resize_bytes_cpu(impl, 3000 * 4);
  EXPECT_EQ(t.data_ptr(), first);
  EXPECT_EQ(pool.mappings(), 1);
  impl->set_allocator(c10::GetCPUAllocator());  // the storage outlives the pool
}

}  // namespace
}  // namespace krab::parallel::zero
