#include "apps/netns.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdlib>

namespace weft::apps {

namespace {

status run(const std::string& cmd) {
  int rc = std::system((cmd + " 2>/dev/null").c_str());
  if (rc != 0)
    return make_error(errc::unavailable, "'" + cmd + "' failed (root and iproute2 needed)");
  return {};
}

}  // namespace

result<netns_topology> netns_topology::create(int n) {
  netns_topology t;
  t.tag_ = std::to_string(::getpid());
  t.subnet_ = static_cast<int>(::getpid() % 250) + 1;
  t.n_ = n;
  t.owned_ = true;
  std::string br = "wb" + t.tag_;
  std::string net = "10.213." + std::to_string(t.subnet_);
  if (auto st = run("ip link add " + br + " type bridge"); !st.ok()) {
    t.owned_ = false;
    return st;
  }
  if (auto st = run("ip addr add " + net + ".1/24 dev " + br + " && ip link set " + br + " up");
      !st.ok()) {
    return st;
  }
  for (int i = 0; i < n; ++i) {
    std::string ns = "weft" + t.tag_ + "n" + std::to_string(i);
    std::string veth = "wv" + t.tag_ + "n" + std::to_string(i);
    std::string cmd = "ip netns add " + ns + " && ip link add " + veth +
                      " type veth peer name eth0 netns " + ns + " && ip link set " + veth +
                      " master " + br + " up && ip -n " + ns + " addr add " + t.address(i) +
                      "/24 dev eth0 && ip -n " + ns + " link set eth0 up && ip -n " + ns +
                      " link set lo up";
    if (auto st = run(cmd); !st.ok()) return st;
  }
  spdlog::info("network namespaces: {} node(s) on bridge {} ({}.0/24)", n, br, net);
  return t;
}

netns_topology::netns_topology(netns_topology&& other) noexcept
    : tag_(std::move(other.tag_)), subnet_(other.subnet_), n_(other.n_), owned_(other.owned_) {
  other.owned_ = false;
}

netns_topology::~netns_topology() {
  if (!owned_) return;
  for (int i = 0; i < n_; ++i) {
    // Deleting the host side removes the pair at once (namespace teardown is asynchronous).
    (void)run("ip link del wv" + tag_ + "n" + std::to_string(i));
    (void)run("ip netns del weft" + tag_ + "n" + std::to_string(i));
  }
  (void)run("ip link del wb" + tag_);
}

std::string netns_topology::address(int i) const {
  return "10.213." + std::to_string(subnet_) + "." + std::to_string(10 + i);
}

std::string netns_topology::gateway() const {
  return "10.213." + std::to_string(subnet_) + ".1";
}

std::string netns_topology::bridge() const {
  return "wb" + tag_;
}

std::string netns_topology::name(int i) const {
  return "weft" + tag_ + "n" + std::to_string(i);
}

std::vector<std::string> netns_topology::exec_prefix(int i) const {
  return {"/usr/bin/env", "ip", "netns", "exec", name(i)};
}

status netns_topology::set_link(int i, bool up) const {
  return run("ip link set wv" + tag_ + "n" + std::to_string(i) + (up ? " up" : " down"));
}

}  // namespace weft::apps
