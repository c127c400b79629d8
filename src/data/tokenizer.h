// Tokenizers for the text source: bytes (every byte a token, vocabulary 256) or a SentencePiece
// model trained elsewhere (spm_train). SentencePiece runs as Debian's /usr/bin/spm_encode and
// /usr/bin/spm_export_vocab (package sentencepiece), not linked and never looked up on PATH: see
// tokenizer.cpp and core/subprocess.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace krab::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual int64_t vocab_size() const = 0;
  // What a token is, plural, for messages: "bytes" or "tokens".
  virtual const char* unit() const { return "tokens"; }
  // The token ids of `text`, each in [0, vocab_size()).
  virtual std::vector<int64_t> encode(const std::string& text) const = 0;
};

// Every byte is a token: id = the byte's unsigned value.
std::unique_ptr<Tokenizer> byte_tokenizer();

// The SentencePiece model at `model_path` (a `.model` file written by spm_train or
// SentencePieceTrainer). Text is encoded line by line and the ids concatenated (SentencePiece
// normalises a newline to whitespace, so line breaks are not tokens). InvalidArgument naming
// `key` and the file when it does not load, or `key` and the package when the programs are not
// installed.
std::unique_ptr<Tokenizer> sentencepiece_tokenizer(const std::string& model_path,
                                                   const std::string& key);

}  // namespace krab::data
