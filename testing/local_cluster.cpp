#include "testing/local_cluster.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <caf/all.hpp>

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <thread>

#include "actors/cluster_client.hpp"

namespace weft::testing {

uint16_t free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

bool eventually(const std::function<bool()>& pred, int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

std::string default_weft_binary() {
  const char* env = std::getenv("WEFT_BINARY");
  return env != nullptr && *env != '\0' ? std::string{env} : std::string{"weft"};
}

local_cluster::local_cluster(local_cluster_options opts) : opts_(std::move(opts)) {
  if (opts_.weft_binary.empty()) opts_.weft_binary = default_weft_binary();
  port_ = free_port();
  start_node(0, true);
  for (int i = 1; i < opts_.nodes; ++i) start_node(i, false);
  actors::runtime_options base;
  base.worker_threads = 2;
  auto rt = opts_.tls ? actors::secure_runtime(base, secret(), opts_.tls->certificate,
                                               opts_.tls->key, opts_.tls->ca_file)
                      : actors::secure_runtime(base, secret());
  if (!rt) throw std::runtime_error(rt.error().to_string());
  cfg_ = std::make_unique<actors::runtime_config>(*rt);
  sys_ = std::make_unique<caf::actor_system>(*cfg_);
  auto h = actors::connect_head(*sys_, "127.0.0.1", port_);
  if (!h) throw std::runtime_error(h.error().to_string());
  head_ = *h;
}

local_cluster::~local_cluster() {
  for (auto& c : children_) {
    c.signal(SIGCONT);  // a stopped node cannot handle SIGTERM
    c.stop(2000);
  }
}

void local_cluster::start_node(int index, bool head, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {
      opts_.weft_binary, "node",       "--node-id",   "node-" + std::to_string(index),
      "--secret",        opts_.secret, "--log-level", "warn"};
  if (head) {
    argv.insert(argv.end(), {"--head", "--port", std::to_string(port_)});
  } else {
    argv.insert(argv.end(), {"--join", "127.0.0.1:" + std::to_string(port_)});
  }
  argv.insert(argv.end(), opts_.extra_args.begin(), opts_.extra_args.end());
  if (opts_.tls) {
    argv.insert(argv.end(), {"--tls-cert", opts_.tls->certificate, "--tls-key", opts_.tls->key,
                             "--tls-ca", opts_.tls->ca_file});
  }
  argv.insert(argv.end(), args.begin(), args.end());
  auto c = actors::child_process::start(argv);
  if (!c) {
    throw std::runtime_error("cannot start " + opts_.weft_binary + " node: " +
                             c.error().to_string() + " (set WEFT_BINARY to the weft executable)");
  }
  bool ready = false;
  for (int i = 0; i < 50 && !ready; ++i) {
    auto line = c->read_line(15000);
    if (!line) break;
    ready = line->rfind("weft-node-ready", 0) == 0;
  }
  if (!ready) throw std::runtime_error("node-" + std::to_string(index) + " did not start");
  if (static_cast<size_t>(index) < children_.size()) {
    children_[static_cast<size_t>(index)] = std::move(*c);
  } else {
    children_.push_back(std::move(*c));
  }
}

void local_cluster::kill_node(int index) {
  process(index).signal(SIGKILL);
}

void local_cluster::stop_node(int index, bool resume) {
  process(index).signal(resume ? SIGCONT : SIGSTOP);
}

caf::actor_system& local_cluster::system() {
  return *sys_;
}
const actors::head_actor& local_cluster::head() const {
  return head_;
}
actors::cluster_secret local_cluster::secret() const {
  return actors::cluster_secret{opts_.secret};
}
actors::child_process& local_cluster::process(int index) {
  return children_.at(static_cast<size_t>(index));
}

schema::envelope local_cluster::status() {
  auto st = actors::cluster_status(*sys_, head_);
  if (!st) throw std::runtime_error(st.error().to_string());
  return *st;
}

std::string local_cluster::node_state(const std::string& id) {
  auto env = status();
  auto v = env.read<schema::wire::ClusterStatus>();
  if (!v) return "";
  for (auto n : v->get().getNodes()) {
    if (id == n.getNode().getNodeId().cStr()) {
      switch (n.getState()) {
        case schema::wire::NodeState::ALIVE:
          return "alive";
        case schema::wire::NodeState::SUSPECT:
          return "suspect";
        case schema::wire::NodeState::DEAD:
          return "dead";
        default:
          return "other";
      }
    }
  }
  return "";
}

bool local_cluster::wait_node_state(const std::string& id, const std::string& state,
                                    int timeout_ms) {
  return eventually([&] { return node_state(id) == state; }, timeout_ms);
}

std::string local_cluster::node_of(const std::string& name) {
  auto env = status();
  auto v = env.read<schema::wire::ClusterStatus>();
  if (!v) return "";
  for (auto n : v->get().getNodes()) {
    if (n.getState() != schema::wire::NodeState::ALIVE) continue;
    for (auto a : n.getActors()) {
      if (name == a.getName().cStr() && a.getState() == schema::wire::ActorState::RUNNING) {
        return n.getNode().getNodeId().cStr();
      }
    }
  }
  return "";
}

int local_cluster::index_of(const std::string& node_id) {
  if (node_id.rfind("node-", 0) != 0) return -1;
  try {
    return std::stoi(node_id.substr(5));
  } catch (const std::exception&) {
    return -1;
  }
}

bool local_cluster::ping(const caf::actor& a, uint64_t seq, int timeout_ms) {
  caf::scoped_actor self{*sys_};
  bool ok = false;
  auto p = schema::envelope::build<schema::wire::Ping>([&](auto b) { b.setSeq(seq); });
  self->request(a, std::chrono::milliseconds(timeout_ms), actors::ping_atom::value, p)
      .receive(
          [&](const schema::envelope& e) {
            auto v = e.read<schema::wire::Ping>();
            ok = v.ok() && v->get().getSeq() == seq;
          },
          [&](caf::error&) {});
  return ok;
}

}  // namespace weft::testing
