// proc_time: the wall time and peak RSS of a command's own process, for the benchmark scripts
// (bench_lib.sh builds it on first use; it is not part of hetplan).
//
//   proc_time -r RESULT [-n N] [-o PREFIX] -- CMD [ARGS...]
//
// Starts N copies of CMD at once (default 1), waits for all of them, and writes one line to RESULT:
//   "<wall s> <largest peak RSS of a copy, KiB> <first non-zero exit status, else 0>"
// The wall time runs from just before the first copy is started to the return of the wait for the
// last one (CLOCK_MONOTONIC, nanoseconds): the command's processes alone. Timing from a shell around
// /usr/bin/time, as before, also counted a fork of the shell and the start of `time` itself, about
// 1.5 ms on a 2-core VM, and GNU time's own wall clock has only 10 ms of resolution.
// With -o, copy i (from 1) writes its stdout and stderr to PREFIX<i>.out; without, the copies keep
// this process's. Its own exit status is the RESULT line's third field (127: CMD could not start;
// 2: bad arguments).
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

extern char** environ;

namespace {

double now_s() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

int usage(const char* why) {
  std::fprintf(stderr, "proc_time: %s\nusage: proc_time -r RESULT [-n N] [-o PREFIX] -- CMD [ARGS...]\n", why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string result, prefix;
  int copies = 1, i = 1;
  for (; i < argc && std::strcmp(argv[i], "--") != 0; i += 2) {
    if (i + 1 >= argc) return usage("an option lacks its value");
    if (std::strcmp(argv[i], "-r") == 0) {
      result = argv[i + 1];
    } else if (std::strcmp(argv[i], "-o") == 0) {
      prefix = argv[i + 1];
    } else if (std::strcmp(argv[i], "-n") == 0) {
      copies = std::atoi(argv[i + 1]);
      if (copies < 1 || copies > 64) return usage("-n expects 1 to 64");
    } else {
      return usage((std::string("unknown option ") + argv[i]).c_str());
    }
  }
  if (result.empty()) return usage("-r RESULT is required");
  if (i + 1 >= argc) return usage("no command after --");
  char** cmd = argv + i + 1;

  // The output files are opened before the clock starts.
  std::vector<posix_spawn_file_actions_t> actions(copies);
  for (int c = 0; c < copies; ++c) {
    posix_spawn_file_actions_init(&actions[c]);
    if (prefix.empty()) continue;
    const std::string path = prefix + std::to_string(c + 1) + ".out";
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return usage(("cannot write " + path).c_str());
    posix_spawn_file_actions_adddup2(&actions[c], fd, STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions[c], fd, STDERR_FILENO);
  }

  int status_out = 0;
  long max_rss_kb = 0;
  int running = 0;
  const double t0 = now_s();
  for (int c = 0; c < copies; ++c) {
    pid_t pid;
    if (posix_spawnp(&pid, cmd[0], &actions[c], nullptr, cmd, environ) != 0) {
      status_out = 127;
      break;
    }
    ++running;
  }
  for (; running > 0; --running) {
    int status = 0;
    rusage ru{};
    if (wait4(-1, &status, 0, &ru) < 0) break;
    max_rss_kb = std::max(max_rss_kb, ru.ru_maxrss);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (status_out == 0) status_out = code;
  }
  const double wall = now_s() - t0;

  FILE* out = std::fopen(result.c_str(), "w");
  if (!out) return usage(("cannot write " + result).c_str());
  std::fprintf(out, "%.6f %ld %d\n", wall, max_rss_kb, status_out);
  std::fclose(out);
  return status_out;
}
