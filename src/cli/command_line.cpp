// Parse errors in krab's words (command_line.h).
#include "cli/command_line.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <vector>

#include "core/errors.h"
#include "core/printable.h"

namespace krab::cli {
namespace {

// The commands named by argv's leading words: {app} for `krab --x`, {app, train} for
// `krab train JOB --x`. Returns the index of the first word after them in `next`.
std::vector<const CLI::App*> command_chain(const CLI::App& app, int argc, char** argv, int& next) {
  std::vector<const CLI::App*> chain{&app};
  for (next = 1; next < argc; ++next) {
    const CLI::App* match = nullptr;
    for (const CLI::App* sub : chain.back()->get_subcommands([](const CLI::App*) { return true; }))
      if (sub->get_name() == argv[next]) match = sub;
    if (match == nullptr) break;
    chain.push_back(match);
  }
  return chain;
}

std::string command_name(const std::vector<const CLI::App*>& chain) {
  std::string name = "krab";
  for (size_t i = 1; i < chain.size(); ++i) name += " " + chain[i]->get_name();
  return name;
}

// "--report", "-h": every spelling of an option of `command` (positionals have none).
std::vector<std::string> option_names(const CLI::App& command) {
  std::vector<std::string> names;
  for (const CLI::Option* opt : command.get_options()) {
    for (const std::string& l : opt->get_lnames()) names.push_back("--" + l);
    for (const std::string& s : opt->get_snames()) names.push_back("-" + s);
  }
  return names;
}

// A word that reads as an option rather than a value: not "-", not a negative number.
bool looks_like_option(const std::string& word) {
  if (word.size() < 2 || word[0] != '-') return false;
  char* end = nullptr;
  std::strtod(word.c_str(), &end);
  return *end != '\0';
}

// The name among `names` closest to `given`: within two edits (and fewer than half its
// letters, so that `-x` is not taken for `-h`), or the only one `given` is a prefix of
// (`--nproc` for `--nproc-per-node`); "" when none is.
std::string closest(const std::string& given, const std::vector<std::string>& names) {
  std::string best;
  size_t best_distance = 3;
  for (const std::string& name : names) {
    const size_t d = edit_distance(given, name);
    if (d < best_distance && 2 * d < given.size()) best_distance = d, best = name;
  }
  if (!best.empty()) return best;
  std::vector<std::string> extended;
  for (const std::string& name : names)
    if (given.size() >= 3 && name.compare(0, given.size(), given) == 0) extended.push_back(name);
  return extended.size() == 1 ? extended[0] : "";
}

// The first option word of argv after the commands that `command` does not define.
std::string first_unknown_option(const CLI::App& command, int first, int argc, char** argv) {
  const std::vector<std::string> known = option_names(command);
  for (int i = first; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--") break;
    if (!looks_like_option(word)) continue;
    const std::string name = word.substr(0, word.find('='));
    if (std::find(known.begin(), known.end(), name) == known.end()) return name;
  }
  return "";
}

}  // namespace

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string unknown_command(const CLI::App& app, int argc, char** argv) {
  const CLI::App* at = &app;
  for (int i = 1; i < argc; ++i) {
    const auto subs = at->get_subcommands([](const CLI::App*) { return true; });
    if (subs.empty() || argv[i][0] == '-') return "";
    const std::string given = argv[i];
    const CLI::App* match = nullptr;
    std::string all;
    std::vector<std::string> names;
    for (const CLI::App* sub : subs) {
      if (sub->get_name() == given) match = sub;
      all += (all.empty() ? "" : ", ") + sub->get_name();
      names.push_back(sub->get_name());
    }
    if (match != nullptr) {
      at = match;
      continue;
    }
    const std::string best = closest(given, names);
    return best.empty()
               ? str_cat("unknown command '", core::printable(given), "' (commands: ", all, ")")
               : str_cat("unknown command '", core::printable(given), "'; did you mean '", best,
                         "'?");
  }
  return "";
}

std::string parse_error_message(const CLI::App& app, const CLI::ParseError& e, int argc,
                                char** argv) {
  int first = 1;
  const std::vector<const CLI::App*> chain = command_chain(app, argc, argv, first);
  const std::string command = command_name(chain);
  // CLI11 reports an unknown option as an unexpected argument (ExtrasError, listing the option
  // and its value in reverse order) or, before a command, as a missing command. Whatever it
  // said, an option the command does not define is the mistake to name.
  const std::string unknown = first_unknown_option(*chain.back(), first, argc, argv);
  if (!unknown.empty()) {
    const std::string best = closest(unknown, option_names(*chain.back()));
    return str_cat("unknown option '", core::printable(unknown), "' of '", command, "'",
                   best.empty() ? str_cat(" (`", command, " --help` lists its options)")
                                : str_cat("; did you mean '", best, "'?"));
  }
  // Anything else: CLI11's first line ("--nproc-per-node: must be a whole number >= 1, got
  // '0'", "job is required"), which names the option already.
  std::string what = e.what();
  what = what.substr(0, what.find('\n'));
  if (what.size() > 1 && std::isupper(static_cast<unsigned char>(what[0])) &&
      std::islower(static_cast<unsigned char>(what[1])))
    what[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(what[0])));
  if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr ||
      dynamic_cast<const CLI::RequiredError*>(&e) != nullptr)
    what += str_cat(" (`", command, " --help` lists the arguments)");
  return core::printable(what, 400);
}

}  // namespace krab::cli
