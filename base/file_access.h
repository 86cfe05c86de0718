// File access at the edge: reading users' files and writing into users'
// output folders, with every filesystem failure reported as one InputError
// line that names the path and what was expected. Nothing of
// std::filesystem (filesystem_error) or of iostreams escapes these functions.
//
// Reading: a path must name a regular file (directories, FIFOs, sockets and
// devices are refused without blocking on them), symlink loops are named as
// such, and a file that vanishes or fails mid-read is an InputError.
//
// Writing: output stays inside the output folder. A file name taken from
// user text goes through safe_file_name() first; write_file_in() refuses a
// name that is not one plain component, writes a fresh temporary file in the
// folder (O_CREAT | O_EXCL | O_NOFOLLOW) and renames it into place, so an
// existing symlink at the name is replaced, never followed, and a reader
// never sees a half-written file. Sub-folders made by make_subfolder() are
// refused when they are symlinks.
//
// REQUIRES: nothing beyond POSIX. Thread-safe (no shared state); concurrent
// writes of one name in one folder leave one of the contents.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace hetplan {

// The bytes of the regular file at `path`; `what` names it in messages ("hostfile", "JSON file").
// Throws InputError when it is missing, not a regular file, unreadable, a symlink loop, or over
// `max_bytes` (the message gives the size and the limit in bytes).
std::string read_regular_file(const std::string& path, std::size_t max_bytes, const std::string& what);

// Throws InputError unless `path` is a directory (following symlinks; a loop is named as such).
void require_directory(const std::string& path, const std::string& what);

// The names of the entries of the directory `path` (not "." or ".."), unsorted.
std::vector<std::string> list_directory(const std::string& path, const std::string& what);

// "regular file", "directory", "FIFO", "socket", "device", "symlink loop", "missing" or
// "inaccessible": what `path` is, following symlinks, for messages and for skipping non-files.
std::string file_kind(const std::string& path);

// Creates the output folder `dir` and its parents where missing. Throws InputError naming `dir` when it
// cannot be made (a file in the way, a read-only or virtual filesystem, no permission).
void make_output_folder(const std::string& dir);

// Creates (where missing) the sub-folder `name` (one plain component) of the output folder `dir` and
// returns its path. Throws InputError when the name is not a plain component or the entry is a symlink
// or anything but a directory: files written under it would land outside `dir`.
std::string make_subfolder(const std::string& dir, const std::string& name);

// `text` as a file name component: bytes outside [A-Za-z0-9._-] become '_', a leading '.' becomes '_'
// (no hidden files, no "." or ".."), at most 100 characters, "_" when empty.
std::string safe_file_name(std::string_view text);

// Writes `contents` to `dir`/`name` through a temporary file renamed into place (see above);
// `executable` adds execute permission. Throws InputError when `name` is not one plain component
// (empty, ".", "..", or holding '/' or NUL) or when the write fails (the message names the path).
void write_file_in(const std::string& dir, const std::string& name, std::string_view contents,
                   bool executable = false);

// `dir`/`name` as a string, for messages ("wrote ...").
std::string path_in(const std::string& dir, const std::string& name);

}  // namespace hetplan
