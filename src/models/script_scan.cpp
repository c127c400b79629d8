#include "models/script_scan.h"

#include <array>
#include <vector>

#include "core/errors.h"
#include "core/printable.h"

namespace krab::models {
namespace {

// --- The policy --------------------------------------------------------------------------------
//
// Found by reading LibTorch 1.13's operator registry (torch._C._jit_get_all_schemas(), the
// schemas in libtorch_cpu.so, register_prim_ops_fulljit.cpp and the distributed registrations):
// the aten:: and prim:: operators that take a file name, a worker name or an RRef.

struct Refused {
  const char* ns;
  const char* name;
  const char* why;
};
constexpr Refused kRefused[] = {
    {"aten", "from_file", "maps a file into memory (with shared=True it creates or overwrites it)"},
    {"aten", "save", "writes a file"},
    {"prim", "rpc_async", "calls a function in another process (RPC)"},
    {"prim", "rpc_sync", "calls a function in another process (RPC)"},
    {"prim", "rpc_remote", "calls a function in another process (RPC)"},
    {"aten", "to_here", "fetches a value from another process (RRef)"},
    {"aten", "local_value", "reads an RRef of distributed RPC"},
    {"aten", "owner", "reads an RRef of distributed RPC"},
    {"aten", "owner_name", "reads an RRef of distributed RPC"},
    {"aten", "is_owner", "reads an RRef of distributed RPC"},
    {"aten", "confirmed_by_owner", "reads an RRef of distributed RPC"},
    {"aten", "get_gradients", "reads distributed autograd's gradients"},
};

// Names the source scan refuses after a dot or inside a string: a method call on any value
// resolves to aten::NAME, and a user's own method of that name cannot be told apart in the text.
// `owner` and `is_owner` are left to the graph walk: an RRef exists only through rpc_remote,
// refused already, and they are common words for a user's attributes.
const Refused* refused_attribute(std::string_view name) {
  for (const Refused& r : kRefused)
    if (name == r.name && name != "owner" && name != "is_owner") return &r;
  return nullptr;
}

bool is_rpc_form(std::string_view name) {
  return name == "rpc_async" || name == "rpc_sync" || name == "rpc_remote";
}

// --- The tokenizer -----------------------------------------------------------------------------
//
// Only what decides whether a byte is code matters here: strings and comments are skipped as
// TorchScript's lexer skips them (lexer.h: a string starts with ' or ", three of them for a long
// string; a backslash takes the next byte with it; a short string may not hold a newline), so
// nothing the compiler reads as code is read here as a string. Numbers keep a dot only when a
// digit follows, so `1 .save` and `1.save` both show `.save` to the scan (stricter than the
// lexer, never looser).

enum class Kind { kName, kDot, kString, kOther };

struct Token {
  Kind kind;
  std::string_view text;  // a string's text without its quotes
  int line;
};

bool name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool digit(char c) { return c >= '0' && c <= '9'; }
bool name_char(char c) { return name_start(c) || digit(c); }

class Tokenizer {
 public:
  explicit Tokenizer(std::string_view s) : s_(s) {}

  // The tokens, or a finding for text the lexer would not read.
  std::optional<ScriptFinding> run(std::vector<Token>* out) {
    while (at_ < s_.size()) {
      const char c = s_[at_];
      if (c == '\n') {
        ++line_, ++at_;
      } else if (c == '#') {
        while (at_ < s_.size() && s_[at_] != '\n') ++at_;
      } else if (c == '"' || c == '\'') {
        if (!string(out)) return ScriptFinding{line_, "a string", "it does not end"};
      } else if (name_start(c)) {
        const size_t from = at_;
        while (at_ < s_.size() && name_char(s_[at_])) ++at_;
        out->push_back({Kind::kName, s_.substr(from, at_ - from), line_});
      } else if (digit(c)) {
        number();
      } else if (c == '.') {
        out->push_back({Kind::kDot, s_.substr(at_++, 1), line_});
      } else {
        if (c != ' ' && c != '\t' && c != '\r' && c != '\f' && c != '\\')
          out->push_back({Kind::kOther, s_.substr(at_, 1), line_});
        ++at_;
      }
    }
    return std::nullopt;
  }

 private:
  bool quotes(char q, size_t at, size_t n) const {
    if (at + n > s_.size()) return false;
    for (size_t i = 0; i < n; ++i)
      if (s_[at + i] != q) return false;
    return true;
  }
  bool string(std::vector<Token>* out) {
    const char q = s_[at_];
    const size_t n = quotes(q, at_, 3) ? 3 : 1;
    const int first_line = line_;
    size_t end = at_ + n;
    while (end < s_.size() && !quotes(q, end, n)) {
      if (s_[end] == '\n') {
        if (n == 1) return false;
        ++line_;
      }
      if (s_[end] == '\\' && end + 1 < s_.size()) {
        if (s_[end + 1] == '\n') ++line_;
        ++end;
      }
      ++end;
    }
    if (end >= s_.size()) return false;
    out->push_back({Kind::kString, s_.substr(at_ + n, end - at_ - n), first_line});
    at_ = end + n;
    return true;
  }
  // Digits, and a dot when a digit follows; letters after them (an exponent, a hex digit, or a
  // keyword the lexer would split off, as in `1if`) are left to be read as names.
  void number() {
    while (at_ < s_.size()) {
      const char c = s_[at_];
      const bool dot_digit = c == '.' && at_ + 1 < s_.size() && digit(s_[at_ + 1]);
      if (!digit(c) && !dot_digit) break;
      ++at_;
    }
  }

  std::string_view s_;
  size_t at_ = 0;
  int line_ = 1;
};

// --- The scan ----------------------------------------------------------------------------------

class Scan {
 public:
  explicit Scan(const std::vector<Token>& t) : t_(t) {}

  std::optional<ScriptFinding> run() {
    for (size_t i = 0; i < t_.size(); ++i) {
      const Token& tok = t_[i];
      if (tok.kind == Kind::kString && (refused_attribute(tok.text) || tok.text == "classes"))
        return finding(tok, str_cat("\"", tok.text, "\""),
                       "a string naming a refused operator or custom classes (getattr reaches "
                       "them by name)");
      if (tok.kind != Kind::kName) continue;
      const bool attribute = i > 0 && t_[i - 1].kind == Kind::kDot;
      if (attribute)
        if (const Refused* r = refused_attribute(tok.text))
          return finding(tok, str_cat(".", tok.text),
                         str_cat("a method of this name resolves to ", r->ns, "::", r->name,
                                 ", which ", r->why));
      if (attribute) continue;
      if (auto f = head(i)) return f;
    }
    return std::nullopt;
  }

 private:
  ScriptFinding finding(const Token& at, const std::string& what, const std::string& why) const {
    return ScriptFinding{at.line, core::printable(what, 80), why};
  }
  // The dotted chain NAME(.NAME)* that starts at token i.
  std::vector<std::string_view> chain(size_t i) const {
    std::vector<std::string_view> names{t_[i].text};
    for (size_t j = i + 1; j + 1 < t_.size(); j += 2) {
      if (t_[j].kind != Kind::kDot || t_[j + 1].kind != Kind::kName) break;
      names.push_back(t_[j + 1].text);
    }
    return names;
  }
  static std::string joined(const std::vector<std::string_view>& names, size_t n) {
    std::string s;
    for (size_t k = 0; k < n && k < names.size(); ++k) s += (k ? "." : "") + std::string(names[k]);
    return s;
  }
  std::optional<ScriptFinding> head(size_t i) const {
    const Token& tok = t_[i];
    if (is_rpc_form(tok.text))
      return finding(tok, std::string(tok.text),
                     str_cat("prim::", tok.text, " ", refused_operator("prim", tok.text)));
    if (tok.text != "torch" && tok.text != "ops" && tok.text != "__torch__") return std::nullopt;
    const auto names = chain(i);
    if (names.size() < 2)
      return finding(tok, std::string(tok.text),
                     str_cat("`", tok.text,
                             "` used as a value (an alias or getattr could reach "
                             "any operator through it)"));
    if (tok.text == "torch") {
      const bool autograd = names[1] == "autograd";  // torch.autograd.NAME is aten::NAME too
      if (autograd && names.size() < 3)
        return finding(tok, "torch.autograd", "`torch.autograd` used as a value");
      const std::string_view op = names[autograd ? 2 : 1];
      const std::string why = refused_operator("aten", op);
      if (!why.empty())
        return finding(tok, joined(names, autograd ? 3 : 2), str_cat("aten::", op, " ", why));
      return std::nullopt;
    }
    if (tok.text == "ops") {
      const std::string why = refused_operator(names[1], names.size() > 2 ? names[2] : "");
      if (!why.empty())
        return finding(tok, joined(names, 3),
                       names.size() > 2 ? str_cat(names[1], "::", names[2], " ", why)
                                        : str_cat(joined(names, 2), " ", why));
      return std::nullopt;
    }
    // __torch__: the classes and functions saved in the archive, and custom classes.
    if (names[1] == "torch" && names.size() < 3)
      return finding(tok, "__torch__.torch", "`__torch__.torch` used as a value");
    if (names[1] == "torch" && names[2] == "classes")
      return finding(tok, joined(names, 5),
                     "a custom class (torch.classes.*) runs C++ code of its own");
    return std::nullopt;
  }

  const std::vector<Token>& t_;
};

}  // namespace

std::string refused_operator(std::string_view ns, std::string_view name) {
  for (const Refused& r : kRefused)
    if (ns == r.ns && name == r.name) return r.why;
  if (ns == "aten" || ns == "prim") return "";
  if (ns == "c10d" || ns.substr(0, 5) == "dist_")
    return str_cat("is in namespace ", ns, ":: of distributed communication (the network)");
  return str_cat("is in namespace ", core::printable(ns, 40),
                 "::, outside aten:: and prim:: (the operators krab runs)");
}

std::optional<ScriptFinding> scan_script_source(std::string_view source) {
  std::vector<Token> tokens;
  if (auto bad = Tokenizer(source).run(&tokens)) return bad;
  return Scan(tokens).run();
}

}  // namespace krab::models
