// Fuzzes the IDX reader, read_idx(path, magic), on plain and gzip files (zlib reads both).
//
// The magic read_idx expects follows the input's own fourth byte (3 dimensions: images, else
// labels), so both kinds of header get explored. Whatever it returns must be the shape and
// size the header promised: uint8 elements, no dimension zero.
#include "data/idx.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = krab::fuzz::write_scratch("data.idx", data, size);
  const uint32_t magic =
      size >= 4 && data[3] == 3 ? krab::data::kIdxImagesMagic : krab::data::kIdxLabelsMagic;
  krab::fuzz::refusals_only([&] {
    const at::Tensor t = krab::data::read_idx(path, magic);
    krab::fuzz::check(t.scalar_type() == at::kByte && t.dim() == int64_t(magic & 0xff),
                      "read_idx returned a tensor of the wrong type or rank");
    krab::fuzz::check(t.numel() > 0, "read_idx returned an empty tensor");
  });
  return 0;
}
