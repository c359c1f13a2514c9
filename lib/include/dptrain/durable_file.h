// Files that survive a crash: a write that lands whole or not at all, and a directory entry
// made durable. POSIX calls only (not std::filesystem: see data.cpp on PyPI's libtorch.so).
// Not here: what the files hold (checkpoint.h, plot.h, metrics.h, download.h).
#pragma once

#include <cstddef>
#include <string>

namespace dptrain {

// fsync of a directory, so that a file created or renamed in it keeps its name after a crash.
// Best effort: some file systems refuse to open or sync a directory, which is harmless here.
void sync_directory(const std::string& directory);
void sync_parent_directory(const std::string& path);  // the directory holding `path`

// Writes `size` bytes to `path` through `path + ".tmp"` in the same directory: write, fsync,
// close, rename, then sync the directory. On failure the temporary file is removed, whatever
// stood at `path` is untouched, and a DataError says "<what>: cannot <step>: <reason><note>".
void write_file_atomically(const std::string& path, const void* data, size_t size,
                           const std::string& what, const std::string& note = "");

}  // namespace dptrain
