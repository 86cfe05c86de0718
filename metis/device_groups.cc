#include "metis/device_groups.h"

#include <algorithm>
#include <numeric>

#include "metis/multiset_permutations.h"

namespace hetplan {

std::vector<int> device_group_shapes(int num_gpus) {
  std::vector<int> shapes;
  for (long s = 1; s <= num_gpus; s *= 2) shapes.push_back(static_cast<int>(s));
  return shapes;
}

namespace {

void compose(int stages, int num_gpus, const std::vector<int>& shapes, int sum, int stage, int first_shape,
             DeviceGroups& current, std::vector<DeviceGroups>& out) {
  // Prune: what is left must fit between the smallest and largest shapes.
  const long left = static_cast<long>(num_gpus) - sum;
  if (static_cast<long>(shapes.back()) * (stages - stage) < left) return;
  if (static_cast<long>(shapes.front()) * (stages - stage) > left) return;
  if (stage >= stages) {
    if (static_cast<int>(current.size()) == stages && sum == num_gpus) out.push_back(current);
    return;
  }
  for (std::size_t i = first_shape; i < shapes.size(); ++i) {
    if (shapes[i] + sum > num_gpus) break;
    current.push_back(shapes[i]);
    compose(stages, num_gpus, shapes, sum + shapes[i], stage + 1, static_cast<int>(i), current, out);
    current.pop_back();
  }
}

int group_sum(const std::vector<int>& g) { return std::accumulate(g.begin(), g.end(), 0); }

}  // namespace

std::vector<DeviceGroups> group_compositions(int stages, int num_gpus, const std::vector<int>& shapes) {
  std::vector<DeviceGroups> out;
  if (shapes.empty() || stages <= 0) return out;
  DeviceGroups current;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    current.assign(1, shapes[i]);
    compose(stages, num_gpus, shapes, shapes[i], 1, static_cast<int>(i), current, out);
  }
  return out;
}

std::vector<std::vector<std::vector<int>>> permute_groups(const DeviceGroups& composition, int max_permute_len) {
  using Group = std::vector<int>;
  std::vector<Group> groups;
  for (int s : composition) groups.push_back({s});

  long num_reduce = static_cast<long>(groups.size()) - max_permute_len;
  while (num_reduce > 0) {
    const int min_group_size = group_sum(groups[0]);
    // Reference quirk kept: the count of leading groups equal to the first is
    // one more than the index of the first different group.
    long num_min_groups = static_cast<long>(groups.size());
    for (std::size_t i = 0; i < groups.size(); ++i) {
      if (groups[i] != groups[0]) {
        num_min_groups = static_cast<long>(i) + 1;
        break;
      }
    }
    if (num_min_groups / 2 > num_reduce) num_reduce = num_min_groups / 2;

    // Merge neighbouring pairs of smallest groups, from the front.
    std::vector<Group> merged;
    for (std::size_t i = 0; i < groups.size(); i += 2) {
      const long reduced = static_cast<long>(i / 2);
      if (num_reduce <= reduced) {
        merged.insert(merged.end(), groups.begin() + i, groups.end());
        break;
      }
      if (i + 1 >= groups.size()) {
        merged.push_back(groups[i]);
      } else if (group_sum(groups[i]) == min_group_size && group_sum(groups[i]) == group_sum(groups[i + 1])) {
        Group g = groups[i];
        g.insert(g.end(), groups[i + 1].begin(), groups[i + 1].end());
        merged.push_back(std::move(g));
      } else {
        merged.push_back(groups[i]);
        merged.push_back(groups[i + 1]);
      }
    }
    groups = std::move(merged);
    const long now = static_cast<long>(groups.size()) - max_permute_len;
    if (num_reduce == now) break;  // nothing more can be merged
    num_reduce = now;
  }

  std::vector<std::vector<Group>> out;
  for_each_multiset_permutation(groups, [&](const std::vector<Group>& p) { out.push_back(p); });
  return out;
}

std::vector<DeviceGroups> device_groups_for_stages(int stages, int num_gpus, double variance, int max_permute_len) {
  const double min_group = static_cast<double>(std::max(num_gpus / stages, stages / num_gpus)) * variance;
  std::vector<int> shapes;
  for (int s : device_group_shapes(num_gpus))
    if (s >= min_group) shapes.push_back(s);

  std::vector<DeviceGroups> out;
  for (const DeviceGroups& composition : group_compositions(stages, num_gpus, shapes)) {
    for (const auto& perm : permute_groups(composition, max_permute_len)) {
      DeviceGroups flat;
      for (const auto& g : perm) flat.insert(flat.end(), g.begin(), g.end());
      out.push_back(std::move(flat));
    }
  }
  return out;
}

}  // namespace hetplan
