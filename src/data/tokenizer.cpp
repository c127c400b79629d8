#include "data/tokenizer.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
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

// A SentencePiece model is a serialised protobuf ModelProto: top-level fields, each a varint key
// (field number << 3 | wire type) and its value, the pieces in field 1 (length-delimited, one
// per piece). spm_export_vocab refuses anything else with a line of its own source locations
// (`spm_export_vocab_main.cc(35) [_status.ok()] Internal: ...`), so the file is walked here
// first: every key well-formed, every value inside the file, at least one piece. Only keys and
// lengths are read (a corpus given by mistake is not read into memory). Returns "" for a file
// that passes, else why it is not a model. A file that passes may still be refused by
// SentencePiece (a piece list without <unk>): the caller turns that into the same message.
std::string not_a_model_because(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return "it cannot be opened";
  const uint64_t size = static_cast<uint64_t>(std::max<std::streamoff>(in.tellg(), 0));
  if (size == 0) return "the file is empty";
  in.seekg(0);
  uint64_t at = 0, pieces = 0;
  auto varint = [&](uint64_t& v) {
    v = 0;
    for (int shift = 0; shift < 64 && at < size; shift += 7) {
      const int byte = in.get();
      ++at;
      if (byte == EOF) return false;
      v |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  };
  auto skip = [&](uint64_t n) {
    if (n > size - at) return false;
    at += n;
    in.seekg(static_cast<std::streamoff>(at));
    return true;
  };
  while (at < size) {
    const uint64_t start = at;
    uint64_t key = 0, value = 0;
    bool ok = varint(key) && (key >> 3) != 0;
    switch (ok ? key & 7 : 7) {
      case 0:
        ok = varint(value);
        break;
      case 1:
        ok = skip(8);
        break;
      case 2:
        ok = varint(value) && skip(value);
        break;
      case 5:
        ok = skip(4);
        break;
      default:
        ok = false;
    }
    if (!ok) return str_cat("not a protobuf message: byte ", start, " does not start a field");
    pieces += key == ((1 << 3) | 2);
  }
  return pieces == 0 ? "it holds no pieces" : "";
}

// SentencePiece's reason without its source locations: "unk is not defined." from
// "spm_export_vocab_main.cc(35) [_status.ok()] Internal: unk is not defined.".
std::string spm_reason(const std::string& out) {
  static const std::regex kLocation(R"([^ \[]+\.(cc|h)\(\d+\) \[[^\]]*\] ?)");
  std::string line = std::regex_replace(out.substr(0, out.find('\n')), kLocation, "");
  for (const char* prefix : {"Internal: ", "Invalid argument: "})
    if (line.rfind(prefix, 0) == 0) line.erase(0, std::string(prefix).size());
  while (!line.empty() && (line.back() == ' ' || line.back() == '.')) line.pop_back();
  return line;
}

// Debian's libsentencepiece carries its own copy of protobuf, whose exported symbols clash with
// the libprotobuf that gRPC and LibTorch load (a crash before main): krab does not link it and
// runs Debian's spm_encode / spm_export_vocab instead (core/subprocess.h: by absolute path, with
// stdio only and a trimmed environment).
class SentencePieceTokenizer : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& path, const std::string& key) : path_(path) {
    KRAB_CHECK_ARG(std::filesystem::is_regular_file(path), key, ": SentencePiece model '", path,
                   "' does not exist");
    const std::string why = not_a_model_because(path);
    KRAB_CHECK_ARG(why.empty(), key, ": '", path, "' is not a SentencePiece model (", why,
                   "; expected the .model file spm_train writes)");
    for (const char* program : {kSpmEncode, kSpmExportVocab})
      KRAB_CHECK_ARG(::access(program, X_OK) == 0, key, ": ", program,
                     " is missing (install Debian's package sentencepiece)");
    const core::ProgramResult vocab = core::run_program(kSpmExportVocab, {"--model=" + path}, "");
    if (vocab.status != 0) {
      const std::string reason = spm_reason(vocab.out);
      throw InvalidArgument(str_cat(key, ": '", path, "' is not a SentencePiece model (",
                                    "spm_export_vocab refused it",
                                    reason.empty() ? "" : ": " + reason, ")"));
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
