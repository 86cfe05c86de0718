// The limits on what hetplan reads: one definition of each, in one place.
//
// Every reader (hostfiles, clusterfiles, profiles, plan files, model configs,
// flags) checks its values against these and refuses larger ones with an
// InputError naming the key and the limit; the core (search, cost model,
// simulator) may then assume them and never throws an internal error on an
// input a reader accepted. No real cluster or model comes near them: they
// keep counts inside int and every parameter and FLOP count inside 64-bit
// integers and doubles (Llama-3.1-405B: 126 blocks, hidden 16384, vocab
// 128256, 128 heads).
//
// Header only, constants only; includes nothing of ours.
#pragma once

#include <cstddef>

namespace hetplan {

// Model shape (sim/model_config.h, sim/model_shape.h).
inline constexpr int kMaxModelLayers = 4096;  // Metis layers: blocks + embedding + head
inline constexpr long long kMaxHiddenSize = 1 << 20;
inline constexpr long long kMaxFfnSize = 1 << 22;
inline constexpr long long kMaxVocabSize = 1 << 24;
inline constexpr long long kMaxSequenceLength = 1 << 24;  // also max positions
inline constexpr int kMaxAttentionHeads = 1 << 16;
inline constexpr int kMaxGlobalBatch = 1 << 24;  // sequences per iteration

// Profiles (sim/profile.h).
inline constexpr int kMaxProfileLayers = kMaxModelLayers;
inline constexpr int kMaxProfileTp = 1024;
inline constexpr int kMaxProfileBs = 65536;
inline constexpr double kMaxProfileMs = 1e9;  // 11.6 days for one layer
inline constexpr double kMaxProfileMb = 1e9;  // 1 PB

// Cluster (sim/cluster.h).
inline constexpr int kMaxSlotsPerNode = 1024;
inline constexpr int kMaxClusterGpus = 1000000;
inline constexpr std::size_t kMaxHostfileLineChars = 1024;
inline constexpr std::size_t kMaxHostfileBytes = std::size_t{128} << 20;
inline constexpr double kMaxGpuMemoryGb = 1e6;
inline constexpr double kMaxGpuPricePerHour = 1e4;  // USD per GPU-hour (clusterfile price_per_gpu_hour)
inline constexpr int kMaxEmulatedSms = 1024;

// Data-parallel replicas of one stage: the cost models keep per-replica arrays of this size on the stack
// (sim/plan_cost.cc, metis/metis_cost.cc, sim/data_load_balancer.cc). Plan files with a larger dp are
// refused by their reader; the search never forms one; whatif rows beyond it are not offered.
inline constexpr int kMaxReplicas = 4096;

// Files (base/json_util.h): profiles, plans, clusterfiles and configs are kilobytes; a 30,000-layer
// profile is 181 KB, a 60,000-entry GPU catalogue 9 MB.
inline constexpr std::size_t kMaxJsonFileBytes = 16u << 20;

}  // namespace hetplan
