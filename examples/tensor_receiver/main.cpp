// Example 3 (docs/embedding.md): an actor of yours that receives tensors from another process over
// UCX. Bulk bytes never travel through a mailbox: the sender registers the tensor's memory with a
// data-plane engine and sends a small control message (TensorOffer, your own Cap'n Proto schema)
// that describes it; the receiving actor pulls the bytes with a one-sided get that has a
// deadline, checks them, and answers TensorReceived. The sender keeps the memory only for the
// offer's lease: after the answer, or once the lease expires, it is released.
//
// One binary, two processes: run without --join it is the sender and the head of a local cluster,
// and starts itself again with --join as the receiver node, where the head places the
// "tensor_sink" actor.
//
//   tensor_receiver [--tensors N] [--mib M] [--lease-ms L]

#include <caf/all.hpp>

#include <weft/actors/auth.hpp>
#include <weft/actors/cluster_client.hpp>
#include <weft/actors/node.hpp>
#include <weft/actors/roles.hpp>
#include <weft/schema/caf_bridge.hpp>
#include <weft/transport/checksum.hpp>
#include <weft/transport/registry.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tensor.capnp.h"

namespace {

using weft::schema::envelope;
using offer_atom = caf::atom_constant<caf::atom("t_offer")>;
using clock_type = std::chrono::steady_clock;

envelope error_envelope(const std::string& what) {
  return weft::schema::make_error_envelope(weft::make_error(weft::errc::internal, what));
}

// -- the receiving actor (on the receiver node) -------------------------------------------------

// Pulls the offered bytes into memory of its own and answers with their checksum. Detached: it
// waits for its transfers on its own thread.
caf::behavior tensor_sink(std::shared_ptr<weft::transport::engine> eng) {
  return {
      [eng](offer_atom, const envelope& env) -> envelope {
        auto offer = env.read_user<tensor::TensorOffer>();
        if (!offer) return weft::schema::make_error_envelope(offer.error());
        auto o = offer->get();
        const uint64_t bytes = o.getBytes();
        auto local = eng->allocate_memory(bytes);
        if (!local) return error_envelope(local.error().message);
        auto peer = eng->connect(
            {reinterpret_cast<const std::byte*>(o.getAddress().begin()), o.getAddress().size()});
        if (!peer) return error_envelope(peer.error().message);
        auto remote = eng->import_remote(
            *peer,
            {reinterpret_cast<const std::byte*>(o.getRegion().begin()), o.getRegion().size()});
        if (!remote) return error_envelope(remote.error().message);
        const auto t0 = clock_type::now();
        weft::transport::rma_request get;
        get.peer = *peer;
        get.local = *local;
        get.remote = *remote;
        get.size_bytes = bytes;
        get.options.timeout_ms = o.getLeaseMs();  // never wait past the sender's lease
        auto t = eng->get(get, nullptr);
        weft::transport::completion done;
        if (t) done = eng->wait(*t);
        const double micros =
            std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
        const uint64_t sum = weft::transport::checksum(local->data, bytes);
        eng->release_remote(*remote);
        eng->release_memory(*local);
        if (!t) return error_envelope(t.error().message);
        if (!done.result.ok()) return error_envelope("pull failed: " + done.result.message);
        return envelope::build_user<tensor::TensorReceived>([&](tensor::TensorReceived::Builder r) {
          r.setName(o.getName());
          r.setChecksum(sum);
          r.setMicros(static_cast<uint64_t>(micros));
          r.setNode(static_cast<uint32_t>(getpid()));
        });
      },
  };
}

weft::result<caf::actor> make_tensor_sink(caf::actor_system& sys,
                                          const weft::actors::role_context& ctx) {
  if (!ctx.engine) {
    return weft::make_error(weft::errc::unavailable,
                            "tensor_sink needs a node with a data-plane transport (ucx)");
  }
  return sys.spawn<caf::detached>(tensor_sink, ctx.engine);
}

std::shared_ptr<weft::actors::role_registry> role_table() {
  auto roles = std::make_shared<weft::actors::role_registry>();
  weft::actors::add_builtin_roles(*roles);
  roles->add("tensor_sink", make_tensor_sink);
  return roles;
}

// -- the receiver process ----------------------------------------------------------------------

int run_receiver(uint16_t head_port) {
  auto secret = weft::actors::load_secret("", "");  // from $WEFT_CLUSTER_SECRET
  if (!secret) return std::fprintf(stderr, "receiver: %s\n", secret.error().message.c_str()), 1;
  weft::actors::node_options no;
  no.node_id = "receiver";
  no.join_port = head_port;
  no.roles = {"tensor_sink"};
  no.secret = *secret;
  no.transport = "ucx";
  auto node = weft::actors::node::start(no, role_table());
  if (!node) return std::fprintf(stderr, "receiver: %s\n", node.error().to_string().c_str()), 1;
  std::atomic<bool> lost{false};
  (*node)->on_head_lost([&](const std::string&) { lost = true; });
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  timespec tick{0, 100'000'000};
  while (!lost && sigtimedwait(&set, nullptr, &tick) < 0) {
  }
  return 0;
}

// -- the sender process ------------------------------------------------------------------------

struct options {
  int tensors = 4;
  int mib = 8;
  uint32_t lease_ms = 5000;
};

int run_sender(const char* self_exe, const options& opt) {
  const std::string secret_hex = weft::actors::generate_secret_hex();
  auto secret = weft::actors::load_secret(secret_hex, "");
  if (!secret) return std::fprintf(stderr, "%s\n", secret.error().message.c_str()), 1;
  weft::actors::node_options no;
  no.node_id = "sender";
  no.is_head = true;
  no.head_port = 0;
  no.roles = {"echo"};  // the sink goes to the receiver node
  no.secret = *secret;
  no.transport = "none";
  auto node = weft::actors::node::start(no, role_table());
  if (!node) return std::fprintf(stderr, "%s\n", node.error().to_string().c_str()), 1;
  auto& sys = (*node)->system();

  // The receiver: this program again, joining with the cluster secret from the environment.
  const std::string port = std::to_string((*node)->head_port());
  std::vector<std::string> env_strings{"WEFT_CLUSTER_SECRET=" + secret_hex};
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "WEFT_CLUSTER_SECRET=", 20) != 0) env_strings.emplace_back(*e);
  }
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<char*> args{const_cast<char*>(self_exe), const_cast<char*>("--join"),
                          const_cast<char*>(port.c_str()), nullptr};
  pid_t child = fork();  // then only exec: this process has threads
  if (child == 0) {
    execve(self_exe, args.data(), envp.data());
    _exit(127);
  }
  auto stop_child = [child] {
    kill(child, SIGTERM);
    // A receiver that does not stop within 5 s is killed: the sender never waits on it forever.
    for (int i = 0; i < 50; ++i) {
      if (waitpid(child, nullptr, WNOHANG) == child) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
  };
  // The head places the sink on a node that accepts its role, once the receiver has joined.
  weft::result<caf::actor> sink = weft::make_error(weft::errc::unavailable, "not placed");
  for (int i = 0; i < 300 && !sink; ++i) {
    sink = weft::actors::spawn_on_cluster(sys, (*node)->head(), *secret, "tensor_sink", "sink");
    if (!sink) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!sink) {
    std::fprintf(stderr, "cannot place the sink: %s\n", sink.error().to_string().c_str());
    stop_child();
    return 1;
  }

  // The sender's data plane: a UCX engine of its own.
  auto eng = weft::transport::make_engine("ucx");
  if (!eng) {
    std::fprintf(stderr, "ucx: %s\n", eng.error().message.c_str());
    stop_child();
    return 1;
  }
  auto address = (*eng)->local_address();
  int received = 0;
  caf::scoped_actor self{sys};
  for (int k = 0; k < opt.tensors; ++k) {
    const size_t bytes = static_cast<size_t>(opt.mib) << 20;
    auto region = (*eng)->allocate_memory(bytes);
    if (!region || !address) break;
    weft::transport::fill_pattern({region->data, bytes}, static_cast<uint64_t>(k) + 1);
    const uint64_t sum = weft::transport::checksum(region->data, bytes);
    auto desc = (*eng)->describe(*region);
    if (!desc) break;
    const std::string name = "layer" + std::to_string(k) + ".weight";
    auto offer = envelope::build_user<tensor::TensorOffer>([&](tensor::TensorOffer::Builder b) {
      b.setName(name);
      b.setDtype("f32");
      auto shape = b.initShape(2);
      shape.set(0, static_cast<uint64_t>(bytes / 4 / 1024));
      shape.set(1, 1024);
      b.setBytes(bytes);
      b.setChecksum(sum);
      b.setAddress(
          kj::arrayPtr(reinterpret_cast<const kj::byte*>(address->data()), address->size()));
      b.setRegion(kj::arrayPtr(reinterpret_cast<const kj::byte*>(desc->data()), desc->size()));
      b.setLeaseMs(opt.lease_ms);
    });
    // The lease: the memory stays registered until the answer, at most lease_ms (+ slack).
    self->request(*sink, std::chrono::milliseconds(opt.lease_ms + 1000), offer_atom::value, offer)
        .receive(
            [&](const envelope& reply) {
              if (auto err = weft::schema::error_from(reply); !err.ok()) {
                std::printf("%s: refused: %s\n", name.c_str(), err.to_string().c_str());
                return;
              }
              auto r = reply.read_user<tensor::TensorReceived>();
              if (!r) {
                std::printf("%s: bad answer: %s\n", name.c_str(), r.error().to_string().c_str());
                return;
              }
              const bool equal = r->get().getChecksum() == sum;
              const double s = static_cast<double>(r->get().getMicros()) / 1e6;
              std::printf("%s: %d MiB pulled by process %u in %.1f ms (%.2f GB/s), checksum %s\n",
                          name.c_str(), opt.mib, r->get().getNode(), s * 1e3,
                          s > 0 ? static_cast<double>(bytes) / s / 1e9 : 0.0,
                          equal ? "equal" : "DIFFERS");
              if (equal) ++received;
            },
            [&](caf::error& err) {
              std::printf("%s: no answer within the lease: %s\n", name.c_str(),
                          caf::to_string(err).c_str());
            });
    (*eng)->release_memory(*region);  // the lease is over either way
  }
  std::printf("tensor_receiver: %d/%d tensors received, checksums %s\n", received, opt.tensors,
              received == opt.tensors ? "equal" : "NOT all equal");
  caf::anon_send_exit(*sink, caf::exit_reason::user_shutdown);
  stop_child();
  return received == opt.tensors ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  options opt;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "tensor_receiver: an actor of yours receives tensors from another process over UCX.\n"
          "  --tensors N    tensors to send (default 4)\n"
          "  --mib M        size of each, MiB (default 8)\n"
          "  --lease-ms L   how long the sender keeps each tensor's memory (default 5000)\n"
          "  --join PORT    (internal) run as the receiver node joining the head on PORT\n");
      return 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "tensor_receiver: %s needs a value (see --help)\n", a.c_str());
      return 2;
    }
    const int v = std::atoi(argv[++i]);
    if (a == "--join") return run_receiver(static_cast<uint16_t>(v));
    if (a == "--tensors")
      opt.tensors = v;
    else if (a == "--mib")
      opt.mib = v;
    else if (a == "--lease-ms")
      opt.lease_ms = static_cast<uint32_t>(v);
    else {
      std::fprintf(stderr, "tensor_receiver: unknown option %s (see --help)\n", a.c_str());
      return 2;
    }
  }
  if (opt.tensors < 1 || opt.mib < 1 || opt.lease_ms < 1) {
    std::fprintf(stderr, "tensor_receiver: --tensors, --mib and --lease-ms must be positive\n");
    return 2;
  }
  return run_sender("/proc/self/exe", opt);
}
