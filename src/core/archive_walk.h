// Walking an archive written by PyTorch (torch.save, torch.jit.save) before LibTorch reads it.
//
// LibTorch's zip reader and unpickler believe the sizes a file states: a record's size in the
// zip directory, a string's length or a memo index in a pickle. A forged file could make them
// allocate gigabytes or read past their buffers (docs/fuzzing.md). The two walks here look at
// the bytes without believing them, so that a reader of untrusted files (data/tensor_file.cpp,
// models/script_inspection.cpp) hands LibTorch only an archive whose every stated size is backed
// by bytes that are there.
//
// Both are pure functions of the bytes they are given; thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <istream>
#include <map>
#include <set>
#include <string>

namespace krab::core {

// Record name -> size in bytes. The name is the one PyTorchStreamReader uses: the path inside
// the archive without its top folder ("data.pkl", "code/__torch__.py", "data/0").
using ArchiveRecords = std::map<std::string, uint64_t>;

// The records of the zip archive of `size` bytes read from `in`, after checking that the
// end-of-directory records (zip64's when present) and every directory entry lie inside the
// archive, and that every record lies inside the archive and is stored, or, when
// `max_inflated` > 0, deflated to at most `max_inflated` bytes. (torch.save stores every
// record; torch.jit.save deflates its source records. LibTorch's reader allocates a deflated
// record's stated size before inflating it, so that size is checked against the cap and
// against deflate's largest ratio, 1032:1, over the compressed bytes that are there.)
// CorruptData "SOURCE: damaged KIND: why" otherwise, where SOURCE names the file (its path)
// and KIND says what it should be ("torch.save archive", "TorchScript archive"). When `stored`
// is given it receives the names of the records that are stored (not deflated): their bytes lie
// in the file as they are.
ArchiveRecords check_zip_directory(std::istream& in, uint64_t size, const std::string& source,
                                   const std::string& kind, uint64_t max_inflated = 0,
                                   std::set<std::string>* stored = nullptr);

// What a pickle names: a GLOBAL or INST opcode's module and name ("__torch__.Net", "Net";
// "torch._utils", "_rebuild_tensor_v2"), or a STACK_GLOBAL opcode, whose names come from the
// stack (is_stack_global; module and name empty then).
struct PickleGlobal {
  std::string module, name;
  bool is_stack_global = false;
};

// Walks the pickle `bytes[0, size)` without running it, calling on_global (when set) for every
// global it names, in order. Checks that
//  - every length fits in what remains, and every memo index is below the pickle's size (a
//    writer numbers them from 0, at most one per opcode; LibTorch's unpickler grows its memo
//    table to the index it reads);
//  - no opcode takes more stack items than there are above the innermost mark, as Python's
//    unpickler requires (LibTorch's takes them unchecked);
//  - every opcode is pickle's (protocols 0 to 5), and the pickle ends with STOP.
// CorruptData "SOURCE: damaged pickle (RECORD) at byte N: why" otherwise. An exception thrown
// by on_global goes through unchanged.
void check_pickle(const char* bytes, size_t size, const std::string& source,
                  const std::string& record,
                  const std::function<void(const PickleGlobal&)>& on_global = {});

}  // namespace krab::core
