// Parameters a randomized method draws from its seed (Linformer's E, F: 2·k·n Gaussians, more work than the attention
// itself at n = 4096) shared read-only between the method objects that draw the same ones: a method object keeps its
// draw across calls, but every fit of attnlab.Method, every head of a batched call and every rebuilt method makes a
// new object, which would draw again. The draw is a pure function of its key (the seed and every option it reads), so
// sharing changes no value: only who pays for it. Entries live as long as some method holds them (weak references:
// nothing is kept for a method that is gone).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace attnlab {

/// The draw named `key` (which must encode everything draw() depends on), made by draw() if no live method holds
/// it, else the one it holds.
template <typename V>
std::shared_ptr<const V> shared_draw(const std::string& key, const std::function<V()>& draw) {
  static std::mutex mutex;
  static std::map<std::string, std::weak_ptr<const V>> live;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto held = live[key].lock()) return held;
  }
  auto made = std::make_shared<const V>(draw());  // outside the lock: two threads may both draw, with equal results
  std::lock_guard<std::mutex> lock(mutex);
  for (auto it = live.begin(); it != live.end();) it = it->second.expired() ? live.erase(it) : std::next(it);
  if (auto held = live[key].lock()) return held;
  live[key] = made;
  return made;
}

}  // namespace attnlab
