// Fuzzes the numeric CSV loader, load_csv(path, "label", 0.25, normalize), with the label
// column named "label". What loads must hold only finite features and labels in 0..classes-1.
#include <torch/torch.h>

#include "data/dataset.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = krab::fuzz::write_scratch("table.csv", data, size);
  krab::fuzz::refusals_only([&] {
    const bool normalize = size % 2 == 0;
    const krab::data::DataSplits d = krab::data::load_csv(path, "label", 0.25, normalize);
    krab::fuzz::check(d.train.inputs.dim() == 2 && d.train.size() >= 1, "no training rows");
    for (const auto* split : {&d.train, d.test ? &*d.test : nullptr})
      if (split)
        krab::fuzz::check(torch::isfinite(split->inputs).all().item<bool>(),
                          "a loaded feature is not finite");
    const at::Tensor y = d.train.targets;
    krab::fuzz::check(y.min().item<int64_t>() >= 0 && y.max().item<int64_t>() < d.num_classes,
                      "a label is outside 0..num_classes-1");
  });
  return 0;
}
