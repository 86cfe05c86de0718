// Device groups: how many GPUs each pipeline stage gets, in rank order.
//
// Metis builds them in three steps, all reproduced here:
//  1. shapes: group sizes are powers of two up to the GPU count, and (key
//     idea 1) at least max(N / stages, stages / N) * variance;
//  2. compositions: non-decreasing lists of `stages` shapes summing to N,
//     in lexicographic order;
//  3. placements: every distinct ordering of each composition, in Williams'
//     order, after (key idea 2) merging the smallest equal groups until at
//     most max_permute_len groups remain, so they move together.
#pragma once

#include <vector>

namespace hetplan {

using DeviceGroups = std::vector<int>;

// Powers of two 1, 2, 4, ... <= num_gpus.
std::vector<int> device_group_shapes(int num_gpus);

// Non-decreasing lists of exactly `stages` entries of `shapes` (sorted
// ascending) that sum to `num_gpus`, in Metis's enumeration order.
std::vector<DeviceGroups> group_compositions(int stages, int num_gpus, const std::vector<int>& shapes);

// Metis's permute(): merges runs of the smallest groups while there are more
// than max_permute_len, then lists the distinct orderings of the merged
// groups. Each result is a list of merged groups (a merged group is the list
// of stage sizes that move together).
std::vector<std::vector<std::vector<int>>> permute_groups(const DeviceGroups& composition, int max_permute_len);

// All device groups with `stages` stages, in the order Metis visits them.
std::vector<DeviceGroups> device_groups_for_stages(int stages, int num_gpus, double variance, int max_permute_len);

}  // namespace hetplan
