#include "data/tokenizer.h"

#include <unistd.h>

#include <filesystem>
#include <sstream>

#include "core/errors.h"
#include "core/subprocess.h"

namespace krab::data {
namespace {

class ByteTokenizer : public Tokenizer {
 public:
  int64_t vocab_size() const override { return 256; }
  const char* unit() const override { return "bytes"; }
  std::vector<int64_t> encode(const std::string& text) const override {
    std::vector<int64_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }
};

// Debian's package sentencepiece installs them here. An absolute path, never a PATH search: a
// program of the same name earlier in PATH would otherwise run with the worker's input.
constexpr const char* kSpmEncode = "/usr/bin/spm_encode";
constexpr const char* kSpmExportVocab = "/usr/bin/spm_export_vocab";

// Debian's libsentencepiece carries its own copy of protobuf, whose exported symbols clash with
// the libprotobuf that gRPC and LibTorch load (a crash before main): krab does not link it and
// runs Debian's spm_encode / spm_export_vocab instead (core/subprocess.h: by absolute path, with
// stdio only and a trimmed environment).
class SentencePieceTokenizer : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& path, const std::string& key) : path_(path) {
    KRAB_CHECK_ARG(std::filesystem::is_regular_file(path), key, ": SentencePiece model '", path,
                   "' does not exist");
    for (const char* program : {kSpmEncode, kSpmExportVocab})
      KRAB_CHECK_ARG(::access(program, X_OK) == 0, key, ": ", program,
                     " is missing (install Debian's package sentencepiece)");
    const core::ProgramResult vocab = core::run_program(kSpmExportVocab, {"--model=" + path}, "");
    if (vocab.status != 0) {
      std::string why = vocab.out.substr(0, vocab.out.find('\n'));
      throw InvalidArgument(str_cat(key, ": cannot load SentencePiece model '", path,
                                    "': ", why.empty() ? "spm_export_vocab failed" : why));
    }
    for (char ch : vocab.out) vocab_ += ch == '\n';
    KRAB_CHECK_ARG(vocab_ >= 2, key, ": SentencePiece model '", path, "' has ", vocab_, " pieces");
  }
  int64_t vocab_size() const override { return vocab_; }
  // One output line per input line, its ids separated by spaces.
  std::vector<int64_t> encode(const std::string& text) const override {
    const core::ProgramResult c =
        core::run_program(kSpmEncode, {"--model=" + path_, "--output_format=id"}, text);
    KRAB_CHECK(c.status == 0, "spm_encode --model=", path_, " failed: ", c.out.substr(0, 200));
    std::vector<int64_t> ids;
    std::istringstream in(c.out);
    for (int64_t id; in >> id;) {
      KRAB_CHECK(id >= 0 && id < vocab_, "spm_encode gave id ", id, " outside [0, ", vocab_, ")");
      ids.push_back(id);
    }
    KRAB_CHECK(in.eof(), "spm_encode printed something that is not an id");
    return ids;
  }

 private:
  std::string path_;
  int64_t vocab_ = 0;
};

}  // namespace

std::unique_ptr<Tokenizer> byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

std::unique_ptr<Tokenizer> sentencepiece_tokenizer(const std::string& model_path,
                                                   const std::string& key) {
  return std::make_unique<SentencePieceTokenizer>(model_path, key);
}

}  // namespace krab::data
