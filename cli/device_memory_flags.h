// --memory-headroom, shared by `search` and `simulate`: the margin every plan keeps free on each GPU
// beyond the device memory it is priced to use (sim/device_memory.h).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "sim/device_memory.h"

namespace hetplan {

inline constexpr const char* kDefaultMemoryHeadroom = "3%";

inline void add_memory_headroom_option(CLI::App* s, std::string* headroom) {
  *headroom = kDefaultMemoryHeadroom;
  s->add_option("--memory-headroom", *headroom,
                "Memory every GPU keeps free beyond what the plan is priced to use: a share of the GPU (\"3%\") or "
                "an amount (\"2GiB\"). A rank's device memory in use = the allocator's peak (states, activations, "
                "working set) + the caching allocator's reserve (6% of that peak, or where larger the head's fp32 "
                "logits, or overlapped ZeRO-2/3's gradient buckets) + the framework constant (CUDA "
                "context and workspaces: the profiles' framework_mb at tp 1, else 767 MiB) + NCCL (152 MiB once, "
                "588 MiB per collective group: world, tp, dp, tied embedding; 420 MiB per p2p group: pipeline pair "
                "and direction, interleaved's wrap-around pairs, the cp ring); a plan fits when that plus the headroom fits every GPU. `simulate` prints the split")
      ->capture_default_str();
}

}  // namespace hetplan
