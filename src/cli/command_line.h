// What `krab` says when its command line cannot be parsed.
//
// CLI11 parses the words; its own messages ("The following arguments were not expected:
// x.json --reprot", then "Run with --help for more information.") read like nothing else krab
// prints. Every command-line mistake is instead one line in krab's error format,
//
//   krab: error: unknown option '--reprot' of 'krab train'; did you mean '--report'?
//   krab: error: --nproc-per-node: must be a whole number >= 1, got '0'
//   krab: error: unknown command 'trian'; did you mean 'train'?
//
// with exit code 2 (bad input), like a bad job key. A misspelt command or option is matched
// against the names the command it was given to knows (within two edits, or the only name it
// is a prefix of). Words from the command line are quoted with core::printable, so a stray
// control byte does not reach the terminal raw.
//
// Pure functions of the parser's definition and argv: nothing here prints or exits.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace krab::cli {

// Levenshtein distance between two words (insertions, deletions, substitutions of one byte).
size_t edit_distance(const std::string& a, const std::string& b);

// The line for a misspelt command (`krab trian`, `krab privacy epsilonn`), which CLI11 would
// only answer with "A subcommand is required"; "" when the words before the first option name
// known commands (or there are none).
std::string unknown_command(const CLI::App& app, int argc, char** argv);

// The message (without the "krab: error: " prefix) for a parse error `e` that CLI11 raised on
// `argv`: an unknown option gets the nearest option of the command it was given to, anything
// else CLI11's own first line. Not for --help and --version (their exit code is 0).
std::string parse_error_message(const CLI::App& app, const CLI::ParseError& e, int argc,
                                char** argv);

}  // namespace krab::cli
