#include "actors/node.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>
#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "actors/cluster_client.hpp"
#include "actors/node_agent.hpp"
#include "transport/registry.hpp"

namespace weft::actors {

struct node::impl {
  std::unique_ptr<runtime_config> cfg;
  std::unique_ptr<caf::actor_system> sys;
  node_agent_actor agent;
  head_actor head;
  caf::actor head_watcher;  // keep the handle: a watcher nobody references is collected
};

namespace {

caf::behavior head_watcher(caf::event_based_actor* self, caf::actor head,
                           std::function<void(const std::string&)> fn) {
  self->monitor(head);
  self->set_down_handler([self, fn](caf::down_msg& dm) {
    fn(caf::to_string(dm.reason));
    self->quit();
  });
  return {[](tick_atom) {}};
}

}  // namespace

result<std::unique_ptr<node>> node::start(node_options opts,
                                          std::shared_ptr<const role_registry> roles) {
  std::unique_ptr<node> n(new node());
  n->impl_ = std::make_unique<impl>();
  if (opts.node_id.empty()) opts.node_id = opts.bind_host + "-" + std::to_string(::getpid());
  if (opts.secret.empty()) return make_error(errc::invalid_argument, "node: no cluster secret");
  auto rt = opts.tls.enabled ? secure_runtime(opts.runtime, opts.secret, opts.tls.certificate,
                                              opts.tls.key, opts.tls.ca_file)
                             : secure_runtime(opts.runtime, opts.secret);
  if (!rt) return make_error(rt.error().code, "tls: " + rt.error().message);
  n->impl_->cfg = std::make_unique<runtime_config>(*rt);
  n->impl_->sys = std::make_unique<caf::actor_system>(*n->impl_->cfg);
  auto& sys = *n->impl_->sys;

  node_agent_config acfg;
  acfg.node_id = opts.node_id;
  acfg.host = opts.bind_host;
  acfg.roles = opts.roles;
  acfg.secret = opts.secret;
  acfg.heartbeat_interval_ms = opts.runtime.heartbeat_interval_ms;
  acfg.role_table = std::move(roles);
  acfg.build_version = opts.build_version;
  if (opts.transport != "none") {
    transport::engine_config ecfg;
    ecfg.params = opts.transport_params;
    auto eng = transport::make_engine(opts.transport, ecfg);
    if (!eng) {
      return make_error(errc::unavailable,
                        "transport '" + opts.transport + "': " + eng.error().to_string());
    }
    acfg.engine = std::shared_ptr<transport::engine>(std::move(*eng));
    auto addr = acfg.engine->local_address();
    if (addr)
      acfg.transport_address.assign(reinterpret_cast<const char*>(addr->data()), addr->size());
  }
  auto port_cell = acfg.port;
  n->impl_->agent = spawn_node_agent(sys, acfg);
  auto agent_port = publish_actor(sys, n->impl_->agent, opts.agent_port, opts.bind_host);
  if (!agent_port) return agent_port.error();
  n->agent_port_ = *agent_port;
  port_cell->store(*agent_port);

  if (opts.is_head) {
    auto hcfg = opts.head;
    // The head is named after its node: ClusterStatus.headId then says which node is the head
    // (`weft chaos --head` spares it; unplaced supervised children are listed on it).
    if (hcfg.head_id == head_config{}.head_id) hcfg.head_id = opts.node_id;
    hcfg.secret = opts.secret;
    hcfg.heartbeat_interval_ms = opts.runtime.heartbeat_interval_ms;
    n->impl_->head = spawn_head(sys, hcfg);
    auto hp = publish_actor(sys, n->impl_->head, opts.head_port, opts.bind_host);
    if (!hp) return hp.error();
    n->head_port_ = *hp;
  } else {
    auto h = connect_head(sys, opts.join_host, opts.join_port);
    if (!h) return h.error();
    n->impl_->head = *h;
    n->head_port_ = opts.join_port;
  }
  if (auto st = join_cluster(sys, n->impl_->head, n->impl_->agent, opts.secret); !st.ok()) {
    return make_error(st.code, "join: " + st.message);
  }
  n->opts_ = std::move(opts);
  return n;
}

node::~node() {
  if (!impl_ || !impl_->sys) return;
  caf::anon_send_exit(impl_->agent, caf::exit_reason::user_shutdown);
  if (impl_->head && opts_.is_head)
    caf::anon_send_exit(impl_->head, caf::exit_reason::user_shutdown);
  if (impl_->head_watcher)
    caf::anon_send_exit(impl_->head_watcher, caf::exit_reason::user_shutdown);
  impl_->sys.reset();
}

caf::actor_system& node::system() {
  return *impl_->sys;
}
node_agent_actor node::agent() const {
  return impl_->agent;
}
head_actor node::head() const {
  return impl_->head;
}

void node::on_head_lost(std::function<void(const std::string&)> fn) {
  impl_->head_watcher =
      impl_->sys->spawn(head_watcher, caf::actor_cast<caf::actor>(impl_->head), std::move(fn));
}

}  // namespace weft::actors
