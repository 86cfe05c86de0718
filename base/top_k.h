// TopK: the K smallest items seen, by key, kept sorted. Both searches keep
// one per worker and merge them, so a key must order items totally (ties
// broken by enumeration order or by the plan itself): then the merged list
// does not depend on which worker saw which item.
//
// Thread-safety: none; one per thread.
#pragma once

#include <algorithm>
#include <utility>
#include <vector>

namespace hetplan {

template <typename Key, typename Item>
class TopK {
 public:
  struct Entry {
    Key key;
    Item item;
  };

  explicit TopK(int k) : k_(k) {}
  bool full() const { return static_cast<int>(items_.size()) >= k_; }
  // The K-th smallest key; REQUIRES: full().
  const Key& kth() const { return items_.back().key; }
  bool wants(const Key& key) const { return !full() || key < items_.back().key; }
  void insert(Key key, Item item) {
    auto it = std::upper_bound(items_.begin(), items_.end(), key,
                               [](const Key& k, const Entry& x) { return k < x.key; });
    items_.insert(it, Entry{std::move(key), std::move(item)});
    if (static_cast<int>(items_.size()) > k_) items_.pop_back();
  }
  std::vector<Entry>& items() { return items_; }

 private:
  int k_;
  std::vector<Entry> items_;
};

}  // namespace hetplan
