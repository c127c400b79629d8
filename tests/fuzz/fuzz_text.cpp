// Fuzzes the byte-level text loader, load_text(path, context, test_fraction). The first byte
// picks the context (1..16) and whether there is a test split; the rest is the file. Every
// window must be context tokens in 0..255 with its targets shifted by one.
#include <torch/torch.h>

#include "data/dataset.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int64_t context = 1 + (data[0] & 0x0f);
  const double test_fraction = (data[0] & 0x10) ? 0.2 : 0.0;
  const std::string path = krab::fuzz::write_scratch("corpus.txt", data + 1, size - 1);
  krab::fuzz::refusals_only([&] {
    const krab::data::DataSplits d = krab::data::load_text(path, context, test_fraction);
    const at::Tensor x = d.train.inputs, y = d.train.targets;
    krab::fuzz::check(x.dim() == 2 && x.size(1) == context && y.sizes() == x.sizes(),
                      "windows of the wrong shape");
    krab::fuzz::check(x.min().item<int64_t>() >= 0 && x.max().item<int64_t>() < 256,
                      "a token outside 0..255");
    krab::fuzz::check(torch::equal(x.narrow(1, 1, context - 1), y.narrow(1, 0, context - 1)),
                      "targets are not the inputs shifted by one");
  });
  return 0;
}
