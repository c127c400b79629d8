#include <torch/torch.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <sstream>

#include "core/errors.h"
#include "core/fs.h"
#include "core/printable.h"
#include "data/dataset.h"
#include "data/rng.h"

namespace krab::data {
namespace {

std::vector<std::string> split_fields(const std::string& line) {
  std::vector<std::string> out;
  std::string field;
  std::istringstream in(line);
  while (std::getline(in, field, ',')) {
    // Trim spaces and a Windows line end.
    const size_t b = field.find_first_not_of(" \t\r");
    const size_t e = field.find_last_not_of(" \t\r");
    std::string value = b == std::string::npos ? "" : field.substr(b, e - b + 1);
    // Spreadsheets quote fields ("1.5", "label"); a quoted comma is not supported.
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"')
      value = value.substr(1, value.size() - 2);
    out.push_back(value);
  }
  if (!line.empty() && line.back() == ',') out.push_back("");
  return out;
}

// The header line: column names and which one holds the label.
struct CsvHeader {
  std::vector<std::string> names;
  int64_t label = -1;
};

CsvHeader read_header(std::istream& in, const std::string& path, const std::string& label_column) {
  std::string line;
  KRAB_CHECK_ARG(static_cast<bool>(std::getline(in, line)), "CSV file '", path, "' is empty");
  if (line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);  // UTF-8 byte order mark (Excel)
  CsvHeader h;
  h.names = split_fields(line);
  std::string names;
  for (size_t i = 0; i < h.names.size(); ++i) {
    if (h.names[i] == label_column) h.label = static_cast<int64_t>(i);
    names += (i ? ", " : "") + core::printable(h.names[i], 40);
  }
  KRAB_CHECK_ARG(h.label >= 0, "data.label_column: '", path, "' has no column '", label_column,
                 "' (columns: ", names, ")");
  KRAB_CHECK_ARG(h.names.size() >= 2, "CSV file '", path,
                 "' has no feature column besides the label");
  return h;
}

// One value of a data row as a finite double; `where` names the file, line and column.
double parse_number(const std::string& v, const std::string& where) {
  if (v.empty()) throw CorruptData(str_cat(where, ": missing value"));
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(v.c_str(), &end);
  if (end != v.c_str() + v.size() || errno == ERANGE || !std::isfinite(x))
    throw CorruptData(str_cat(where, ": '", core::printable(v, 40), "' is not a finite number"));
  return x;
}

// The data rows, in file order: features row-major, float32; labels as class indices.
struct CsvRows {
  std::vector<float> features;
  std::vector<int64_t> labels;
  int64_t max_label = 0;
  int64_t classes = 0;  // data.num_classes; 0: inferred, at most kMaxInferredClasses
};

void add_value(CsvRows& rows, double x, bool is_label, const std::string& v,
               const std::string& where) {
  if (is_label) {
    // A class index sizes the model's output layer: a hostile or mistyped 1e6 would make
    // it a million wide. Inferred, the classes are bounded (dataset.h); stated, they bound.
    const int64_t limit = rows.classes > 0 ? rows.classes : kMaxInferredClasses;
    if (x < 0 || x != std::floor(x) || x >= static_cast<double>(limit))
      throw CorruptData(str_cat(
          where, ": label '", core::printable(v, 40), "' is not a class index (0, 1, ... ",
          limit - 1, ")",
          rows.classes > 0 ? " of data.num_classes " : "; set data.num_classes for more classes",
          rows.classes > 0 ? std::to_string(rows.classes) : ""));
    rows.labels.push_back(static_cast<int64_t>(x));
    rows.max_label = std::max(rows.max_label, rows.labels.back());
  } else {
    // Features are float32: a finite double beyond its range would become inf.
    if (std::fabs(x) > std::numeric_limits<float>::max())
      throw CorruptData(
          str_cat(where, ": '", core::printable(v, 40), "' is outside the float32 range"));
    rows.features.push_back(static_cast<float>(x));
  }
}

CsvRows read_rows(std::istream& in, const std::string& path, const CsvHeader& header,
                  int64_t classes) {
  const int64_t cols = static_cast<int64_t>(header.names.size());
  CsvRows rows;
  rows.classes = classes;
  std::string line;
  for (int64_t no = 2; std::getline(in, line); ++no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::vector<std::string> f = split_fields(line);
    if (static_cast<int64_t>(f.size()) != cols)
      throw CorruptData(str_cat(path, ":", no, ": ", f.size(), " fields, the header has ", cols));
    for (int64_t c = 0; c < cols; ++c) {
      const std::string where =
          str_cat(path, ":", no, ": column '", core::printable(header.names[c], 40), "'");
      add_value(rows, parse_number(f[c], where), c == header.label, f[c], where);
    }
  }
  return rows;
}

// Standardises each feature column with the mean and standard deviation of the first
// `n_train` rows (the training rows); throws CorruptData if a value leaves float32's range.
at::Tensor standardize(const at::Tensor& x, int64_t n_train, const std::string& path) {
  // In double: float32 sums and squares of values near its limit overflow to inf.
  const at::Tensor xd = x.to(torch::kDouble);
  const at::Tensor train = xd.narrow(0, 0, n_train);
  const at::Tensor mean = train.mean(0, true);
  at::Tensor std = n_train > 1 ? train.std(0, true, true) : torch::ones_like(mean);
  std = torch::where(std > 1e-12, std, torch::ones_like(std));  // constant columns: centre
  at::Tensor out = ((xd - mean) / std).to(torch::kFloat);
  // A test row far outside the training rows' spread can still leave float32's range.
  if (!torch::isfinite(out).all().item<bool>())
    throw CorruptData(str_cat("'", path, "': a standardised feature overflows float32 (a ",
                              "value lies far outside its column's training spread)"));
  return out;
}

}  // namespace

DataSplits load_csv(const std::string& path, const std::string& label_column, double test_fraction,
                    bool normalize, int64_t num_classes) {
  KRAB_CHECK_ARG(num_classes >= 0, "data.num_classes must be >= 0, got ", num_classes);
  KRAB_CHECK_ARG(core::path_exists(path), "CSV file '", path, "' does not exist");
  KRAB_CHECK_ARG(!std::filesystem::is_directory(path), "CSV file '", path,
                 "' is a directory (data.path names the .csv file)");
  KRAB_CHECK_ARG(test_fraction >= 0.0 && test_fraction < 1.0,
                 "test fraction must be in [0, 1), got ", test_fraction);
  std::istringstream in(core::read_file(path));
  const CsvHeader header = read_header(in, path, label_column);
  CsvRows rows = read_rows(in, path, header, num_classes);
  const int64_t n = static_cast<int64_t>(rows.labels.size());
  KRAB_CHECK_ARG(n >= 2, "CSV file '", path, "' has ", n, " data rows; need at least 2");
  const int64_t width = static_cast<int64_t>(header.names.size()) - 1;
  at::Tensor x = torch::from_blob(rows.features.data(), {n, width}, torch::kFloat).clone();
  at::Tensor y = torch::from_blob(rows.labels.data(), {n}, torch::kLong).clone();
  // A fixed shuffle: the split must not depend on the job's seed or on how the file is sorted.
  std::mt19937_64 rng(derive_seed(0x637376ULL, static_cast<uint64_t>(n)));
  const std::vector<int64_t> perm = random_permutation(n, rng);
  const at::Tensor idx = torch::tensor(perm, torch::kLong);
  x = x.index_select(0, idx);
  y = y.index_select(0, idx);
  const int64_t n_test = std::llround(static_cast<double>(n) * test_fraction);
  KRAB_CHECK_ARG(n_test < n, "test fraction ", test_fraction, " of ", n,
                 " rows leaves no training examples");
  const int64_t n_train = n - n_test;
  if (normalize) x = standardize(x, n_train, path);
  DataSplits d;
  d.train = {x.narrow(0, 0, n_train).clone(), y.narrow(0, 0, n_train).clone()};
  if (n_test > 0)
    d.test =
        TensorDataset{x.narrow(0, n_train, n_test).clone(), y.narrow(0, n_train, n_test).clone()};
  d.input_shape = {width};
  d.num_classes = num_classes > 0 ? num_classes : std::max<int64_t>(2, rows.max_label + 1);
  d.language_model = false;
  return d;
}

}  // namespace krab::data
