#pragma once
/// Private network namespaces for a local cluster: one namespace per node, joined by a bridge in
/// the caller's namespace, with addresses in 10.213.<k>.0/24 that exist only inside this machine.
/// Needs root and iproute2. Node processes see each other only through the bridge (their own
/// loopback is private), so traffic between them crosses a real (virtual) network link that a
/// chaos test can cut.

#include <string>
#include <vector>

#include "schema/status.hpp"

namespace weft::apps {

class netns_topology {
 public:
  /// Creates the bridge and `n` namespaces. Errors name the failing `ip` command.
  static result<netns_topology> create(int n);
  netns_topology(netns_topology&& other) noexcept;
  netns_topology& operator=(netns_topology&&) = delete;
  netns_topology(const netns_topology&) = delete;
  /// Removes the namespaces and the bridge.
  ~netns_topology();

  /// The address of node `i` inside its namespace.
  std::string address(int i) const;
  /// The bridge's address in the caller's namespace: where processes in the namespaces reach a
  /// server of the caller (a private head, a controller).
  std::string gateway() const;
  /// The bridge's device name in the caller's namespace.
  std::string bridge() const;
  /// The namespace of node `i` (for `ip netns exec` / `nsenter`).
  std::string name(int i) const;
  /// The argv prefix that runs a command inside node `i`'s namespace.
  std::vector<std::string> exec_prefix(int i) const;
  /// Brings node `i`'s link down (cut) or up again.
  status set_link(int i, bool up) const;

 private:
  netns_topology() = default;
  std::string tag_;
  int subnet_ = 0;
  int n_ = 0;
  bool owned_ = false;
};

}  // namespace weft::apps
