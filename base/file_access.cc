#include "base/file_access.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "base/input_error.h"

namespace hetplan {

namespace {

std::string quoted(const std::string& path) { return excerpt(path, 200); }

std::string kind_of_mode(mode_t mode) {
  if (S_ISREG(mode)) return "regular file";
  if (S_ISDIR(mode)) return "directory";
  if (S_ISFIFO(mode)) return "FIFO";
  if (S_ISSOCK(mode)) return "socket";
  if (S_ISLNK(mode)) return "symlink";
  return "device";
}

std::string kind_of_errno(int err) {
  if (err == ELOOP) return "symlink loop";
  if (err == ENOENT || err == ENOTDIR) return "missing";
  return "inaccessible";
}

// Closes a file descriptor when it goes out of scope.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

bool is_plain_component(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

[[noreturn]] void fail_open(const std::string& path, const std::string& what, int err) {
  if (err == ELOOP) throw InputError(quoted(path) + ": is a symlink loop (expected a " + what + ")");
  if (err == ENOENT || err == ENOTDIR) throw InputError(quoted(path) + ": cannot open " + what + ": no such file");
  throw InputError(quoted(path) + ": cannot open " + what + ": " + std::strerror(err));
}

}  // namespace

std::string file_kind(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return kind_of_errno(errno);
  return kind_of_mode(st.st_mode);
}

std::string read_regular_file(const std::string& path, std::size_t max_bytes, const std::string& what) {
  Fd f;
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below.
  do f.fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  while (f.fd < 0 && errno == EINTR);
  if (f.fd < 0) fail_open(path, what, errno);
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) fail_open(path, what, errno);
  if (!S_ISREG(st.st_mode))
    throw InputError(quoted(path) + ": is a " + kind_of_mode(st.st_mode) + " (expected a " + what + ")");
  auto too_big = [&](unsigned long long size) {
    return InputError(quoted(path) + ": file is " + std::to_string(size) + " bytes; hetplan reads a " + what +
                      " of at most " + std::to_string(max_bytes) + " bytes (" + std::to_string(max_bytes >> 20) +
                      " MiB)");
  };
  if (static_cast<unsigned long long>(st.st_size) > max_bytes) throw too_big(static_cast<unsigned long long>(st.st_size));
  std::string text;
  text.reserve(static_cast<std::size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(f.fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw InputError(quoted(path) + ": reading the " + what + " failed: " + std::strerror(errno));
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
    if (text.size() > max_bytes) throw too_big(text.size());
  }
  return text;
}

void require_directory(const std::string& path, const std::string& what) {
  const std::string kind = file_kind(path);
  if (kind == "directory") return;
  if (kind == "missing") throw InputError(quoted(path) + ": " + what + " does not exist");
  throw InputError(quoted(path) + ": is a " + kind + " (expected a " + what + ")");
}

std::vector<std::string> list_directory(const std::string& path, const std::string& what) {
  require_directory(path, what);
  DIR* d = ::opendir(path.c_str());
  if (!d) throw InputError(quoted(path) + ": cannot list the " + what + ": " + std::strerror(errno));
  std::vector<std::string> names;
  errno = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
    errno = 0;
  }
  const int err = errno;
  ::closedir(d);
  if (err != 0) throw InputError(quoted(path) + ": cannot list the " + what + ": " + std::strerror(err));
  return names;
}

void make_output_folder(const std::string& dir) {
  if (dir.empty()) throw InputError("output folder: expected a path, got an empty one");
  // Each prefix in turn, as mkdir -p does; an existing one must be a directory (or a symlink to one:
  // the user's own path may pass through links; only what hetplan makes inside the folder is guarded).
  std::size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    const std::string prefix = dir.substr(0, pos);
    if (prefix.empty() || ::mkdir(prefix.c_str(), 0777) == 0) continue;
    const int err = errno;
    const std::string kind = file_kind(prefix);
    if (kind == "directory") continue;
    if (err == EEXIST || kind != "missing")
      throw InputError(quoted(dir) + ": cannot create the output folder: " + quoted(prefix) + " is a " + kind +
                       " (expected a directory)");
    throw InputError(quoted(dir) + ": cannot create the output folder: " + std::strerror(err));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw InputError(quoted(dir) + ": cannot write into the output folder: " + std::strerror(errno));
}

std::string make_subfolder(const std::string& dir, const std::string& name) {
  if (!is_plain_component(name))
    throw InputError(quoted(dir) + ": refusing sub-folder name '" + excerpt(name) + "' (it would leave the folder)");
  const std::string path = path_in(dir, name);
  if (::mkdir(path.c_str(), 0777) != 0 && errno != EEXIST)
    throw InputError(quoted(path) + ": cannot create the folder: " + std::strerror(errno));
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0)
    throw InputError(quoted(path) + ": cannot create the folder: " + std::strerror(errno));
  if (!S_ISDIR(st.st_mode))
    throw InputError(quoted(path) + ": is a " + kind_of_mode(st.st_mode) +
                     " (expected a directory inside the output folder; remove it)");
  return path;
}

std::string safe_file_name(std::string_view text) {
  std::string out;
  for (char c : text.substr(0, 100)) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-';
    out += ok ? c : '_';
  }
  if (out.empty()) return "_";
  if (out[0] == '.') out[0] = '_';
  return out;
}

std::string path_in(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

void write_file_in(const std::string& dir, const std::string& name, std::string_view contents, bool executable) {
  if (!is_plain_component(name))
    throw InputError(quoted(dir) + ": refusing to write '" + excerpt(name) + "' (a name that would leave the folder)");
  const std::string target = path_in(dir.empty() ? "." : dir, name);
  static std::atomic<unsigned> counter{0};
  Fd f;
  std::string temp;
  for (int attempt = 0; f.fd < 0; ++attempt) {
    temp = path_in(dir.empty() ? "." : dir, ".hetplan-tmp-" + std::to_string(::getpid()) + "-" +
                                                std::to_string(counter.fetch_add(1)));
    f.fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, executable ? 0777 : 0666);
    if (f.fd < 0 && (errno != EEXIST || attempt > 100))
      throw InputError(quoted(target) + ": cannot write: " + std::strerror(errno));
  }
  std::size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = ::write(f.fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::unlink(temp.c_str());
      throw InputError(quoted(target) + ": write failed: " + std::strerror(err));
    }
    done += static_cast<std::size_t>(n);
  }
  const int closed = ::close(f.fd);
  f.fd = -1;
  if (closed != 0 || ::rename(temp.c_str(), target.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    const std::string kind = file_kind(target);
    if (kind == "directory") throw InputError(quoted(target) + ": is a directory (expected a file hetplan may replace)");
    throw InputError(quoted(target) + ": write failed: " + std::strerror(err));
  }
}

}  // namespace hetplan
