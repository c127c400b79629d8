#include "data/tokenizer.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <thread>

#include "core/errors.h"

extern char** environ;

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

struct Captured {
  int status = -1;  // exit status, or -1 when it did not exit normally
  std::string out;  // stdout and stderr together
};

// Runs `argv` (no shell; found on PATH) with `input` on its stdin and returns what it printed.
Captured run_capture(const std::vector<std::string>& argv, const std::string& input) {
  int in[2], out[2];
  KRAB_CHECK(pipe(in) == 0 && pipe(out) == 0, "pipe: ", std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, out[1], 2);
  for (int fd : {in[0], in[1], out[0], out[1]}) posix_spawn_file_actions_addclose(&actions, fd);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(in[0]);
  close(out[1]);
  if (rc != 0) {
    close(in[1]);
    close(out[0]);
    throw InvalidArgument(
        str_cat("cannot run ", argv[0], " (Debian package sentencepiece): ", std::strerror(rc)));
  }
  // A writer thread feeds the input while this thread drains the output, so neither pipe can
  // fill up and stall the other.
  std::thread writer([fd = in[1], &input] {
    size_t at = 0;
    while (at < input.size()) {
      const ssize_t n = write(fd, input.data() + at, input.size() - at);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // the child exited early: its status says why
      at += static_cast<size_t>(n);
    }
    close(fd);
  });
  Captured c;
  char buf[1 << 16];
  for (ssize_t n; (n = read(out[0], buf, sizeof(buf))) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    c.out.append(buf, static_cast<size_t>(n));
  }
  close(out[0]);
  writer.join();
  int ws = 0;
  waitpid(pid, &ws, 0);
  c.status = WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
  return c;
}

// Debian's libsentencepiece carries its own copy of protobuf, whose exported symbols clash with
// the libprotobuf that gRPC and LibTorch load (a crash before main): krab does not link it and
// runs Debian's spm_encode / spm_export_vocab instead.
class SentencePieceTokenizer : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& path, const std::string& key) : path_(path) {
    KRAB_CHECK_ARG(std::filesystem::is_regular_file(path), key, ": SentencePiece model '", path,
                   "' does not exist");
    const Captured vocab = run_capture({"spm_export_vocab", "--model=" + path}, "");
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
    const Captured c = run_capture({"spm_encode", "--model=" + path_, "--output_format=id"}, text);
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
