// Permutations of a multiset in Williams' prefix-shift order.
//
// This is the order Metis visits device-group permutations in ("Loopless
// Generation of Multiset Permutations using a Constant Number of Variables by
// Prefix Shifts", A. Williams, 2009): it starts from the elements in
// non-increasing order and each next permutation moves one element to the
// front. Every distinct arrangement is visited exactly once. The order is not
// lexicographic, and the search's tie-breaking depends on it.
#pragma once

#include <algorithm>
#include <vector>

namespace hetplan {

// Calls visit(const std::vector<T>&) for each permutation of `items`
// (any order on input; T needs operator<). Returns the number visited.
template <typename T, typename Visit>
long for_each_multiset_permutation(std::vector<T> items, Visit&& visit) {
  const int n = static_cast<int>(items.size());
  if (n == 0) return 0;
  // A singly linked list over `items`, head first, in non-increasing order.
  std::sort(items.begin(), items.end());
  std::reverse(items.begin(), items.end());
  std::vector<int> next(n);
  for (int k = 0; k < n; ++k) next[k] = k + 1 < n ? k + 1 : -1;
  int h = 0;
  int i = n >= 2 ? n - 2 : 0;  // second-last node
  int j = n - 1;               // last node
  std::vector<T> out;
  out.reserve(n);
  auto emit = [&] {
    out.clear();
    for (int o = h; o != -1; o = next[o]) out.push_back(items[o]);
    visit(static_cast<const std::vector<T>&>(out));
  };
  long count = 1;
  emit();
  while (next[j] != -1 || items[j] < items[h]) {
    int s;
    if (next[j] != -1 && !(items[i] < items[next[j]])) {
      s = j;
    } else {
      s = i;
    }
    const int t = next[s];
    next[s] = next[t];
    next[t] = h;
    if (items[t] < items[h]) i = t;
    j = next[i];
    h = t;
    ++count;
    emit();
  }
  return count;
}

}  // namespace hetplan
