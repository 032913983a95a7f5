// Baseline for weft's actor round trip: the ping-pong of ray_pingpong.py written against Ray's C++
// API, so that weft (C++) is also compared with Ray without Python on either side of the call.
//
// Prints one JSON line: p50/p99 round trip (us) of a 64-byte std::string to an actor in another
// process (a Ray C++ worker), and pipelined messages/s (n calls submitted, then all fetched); or
// {"error": ...}. Run by bench/micro/runtime (weft_bench_runtime) in the same run; built by
// scripts/build_ray_cpp_bench.sh against the ray-cpp wheel (old libstdc++ string ABI, C++17).
//
// The driver starts its own single-node Ray cluster (`ray start --head --block`, 2 CPUs, on a free
// port) and stops only that one at the end: ray::Init() without an address would start one on
// 6379 and ray::Shutdown() would then run `ray stop`, which ends every Ray cluster on the host.
// The same file is also built as a shared library next to the program: the Ray C++ worker process
// that hosts the actor loads Echo from it (the job's code search path).
//
// By hand: scripts/build_ray_cpp_bench.sh && build/ray-cpp/ray_cpp_pingpong [n]

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ray/api.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#ifndef RAY_CPP_CLI
#define RAY_CPP_CLI "ray"  // the `ray` command of the Python environment holding ray-cpp
#endif
#ifndef RAY_CPP_LIB_DIR
#define RAY_CPP_LIB_DIR ""  // directory of libray_api.so (the worker process needs it too)
#endif
#ifndef RAY_CPP_VERSION
#define RAY_CPP_VERSION "unknown"
#endif

/// The actor: returns its argument.
class Echo {
 public:
  static Echo* Create() { return new Echo(); }
  std::string Ping(std::string x) { return x; }
};
RAY_REMOTE(Echo::Create, &Echo::Ping);

namespace {

using steady = std::chrono::steady_clock;
using nlohmann::json;

double us_since(steady::time_point t) {
  return std::chrono::duration<double, std::micro>(steady::now() - t).count();
}

/// A loopback TCP port nobody listens on right now.
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// Runs `ray <args>` (the Ray CLI of the ray-cpp environment), its output to `out_fd`. It gets
/// SIGTERM when this driver dies, also without cleaning up (a failed RAY_CHECK aborts it).
pid_t spawn_ray(std::vector<std::string> args, int out_fd) {
  args.insert(args.begin(), RAY_CPP_CLI);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) _exit(1);
    int null_fd = ::open("/dev/null", O_RDONLY);
    ::dup2(null_fd, STDIN_FILENO);
    ::dup2(out_fd, STDOUT_FILENO);
    ::dup2(out_fd, STDERR_FILENO);
    if (null_fd > STDERR_FILENO) ::close(null_fd);
    if (out_fd > STDERR_FILENO) ::close(out_fd);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "could not run %s: %s\n", argv[0], std::strerror(errno));
    _exit(127);
  }
  return pid;
}

/// A private single-node Ray cluster: `ray start --head --block` as a child of this process,
/// its output in a log file. SIGTERM makes `ray start --block` stop every process it started.
/// It has its own temp dir: `ray start` records its address in <temp dir>/ray_current_cluster, and
/// if that were /tmp/ray's, a later ray.init() without an address (ray_pingpong.py's) would try to
/// join the dead cluster instead of starting one.
class ray_head {
 public:
  ray_head() = default;
  ray_head(const ray_head&) = delete;
  ray_head& operator=(const ray_head&) = delete;
  ~ray_head() { stop(); }

  /// Starts the head and waits (at most `timeout_s`) until it reports "Ray runtime started".
  bool start(int timeout_s, std::string* error) {
    port_ = free_port();
    char log_template[] = "/tmp/ray_cpp_pingpong_head_XXXXXX";
    int log_fd = ::mkstemp(log_template);
    if (port_ < 0 || log_fd < 0) {
      *error = "no free port or log file";
      return false;
    }
    log_ = log_template;
    // With token authentication (see main), a token must exist: ray.init() would create one.
    const char* auth_mode = std::getenv("RAY_AUTH_MODE");
    if (auth_mode && std::string_view(auth_mode) == "token") {
      pid_t gen = spawn_ray({"get-auth-token", "--generate"}, log_fd);
      int status = 0;
      if (gen < 0 || ::waitpid(gen, &status, 0) != gen || !WIFEXITED(status) ||
          WEXITSTATUS(status) != 0) {
        ::close(log_fd);
        return fail("`ray get-auth-token --generate` failed", error);
      }
    }
    pid_ = spawn_ray(
        {"start", "--head", "--block", "--port=" + std::to_string(port_), "--num-cpus=2",
         "--include-dashboard=false", "--disable-usage-stats", "--temp-dir=/tmp/ray_cpp_pingpong"},
        log_fd);
    ::close(log_fd);
    if (pid_ < 0) return fail(std::string("fork: ") + std::strerror(errno), error);
    auto t = steady::now();
    while (us_since(t) < timeout_s * 1e6) {
      std::string log = read_file(log_);
      if (log.find("Ray runtime started") != std::string::npos) {
        // The driver must name the GCS by the node's own IP (the one `ray start` picked), not
        // 127.0.0.1: Ray's C++ driver otherwise finds no raylet to attach to.
        const std::string key = "Local node IP: ";
        auto at = log.find(key);
        if (at == std::string::npos) return fail("`ray start` did not print the node IP", error);
        at += key.size();
        node_ip_ = log.substr(at, log.find_first_of(" \r\n", at) - at);
        return true;
      }
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return fail("`ray start` exited early", error);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return fail("`ray start` reported no running cluster in " + std::to_string(timeout_s) + " s",
                error);
  }

  std::string address() const { return node_ip_ + ":" + std::to_string(port_); }

  /// SIGTERM, up to 30 s for Ray's processes to end, then SIGKILL.
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    auto t = steady::now();
    while (::waitpid(pid_, nullptr, WNOHANG) == 0) {
      if (us_since(t) > 30e6) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    pid_ = -1;
    if (!log_.empty() && !keep_log_) ::unlink(log_.c_str());
  }

 private:
  /// A failed start keeps `ray start`'s output for the reader of the error.
  bool fail(const std::string& what, std::string* error) {
    keep_log_ = true;
    *error = what + "; its output: " + log_;
    return false;
  }

  pid_t pid_ = -1;
  int port_ = -1;
  std::string node_ip_;
  std::string log_;
  bool keep_log_ = false;
};

/// The library next to this program that holds Echo for the worker process.
std::string worker_library(const char* argv0) {
  char self[4096] = {};
  ssize_t len = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string path = len > 0 ? std::string(self, static_cast<size_t>(len)) : argv0;
  return path + ".so";
}

json measure(int n) {
  auto echo = ray::Actor(Echo::Create).Remote();
  const std::string payload(64, 'x');
  auto first = ray::Get(echo.Task(&Echo::Ping).Remote(payload));  // waits for the worker
  if (!first || *first != payload) return {{"error", "the echo actor returned something else"}};
  for (int i = 0; i < 200; ++i) ray::Get(echo.Task(&Echo::Ping).Remote(payload));

  std::vector<double> lat;
  lat.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    auto t = steady::now();
    ray::Get(echo.Task(&Echo::Ping).Remote(payload));
    lat.push_back(us_since(t));
  }
  std::sort(lat.begin(), lat.end());

  auto t = steady::now();
  std::vector<ray::ObjectRef<std::string>> refs;
  refs.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) refs.push_back(echo.Task(&Echo::Ping).Remote(payload));
  auto replies = ray::Get(refs);
  double rate = n / (us_since(t) / 1e6);
  if (replies.size() != static_cast<size_t>(n) || *replies.back() != payload) {
    return {{"error", "pipelined replies are missing or wrong"}};
  }
  return {{"p50_us", lat[lat.size() / 2]},
          {"p99_us", lat[static_cast<size_t>(lat.size() * 0.99)]},
          {"msgs_per_s", rate},
          {"n", n},
          {"ray_version", RAY_CPP_VERSION},
          {"api", "cpp"},
          {"auth_mode", std::getenv("RAY_AUTH_MODE")}};
}

}  // namespace

int main(int argc, char** argv) {
  // Ray 2.60 turns token authentication on for a new local cluster started by ray.init() (as
  // ray_pingpong.py's is), but `ray start` only when a token exists, and Ray's C++ driver sends the
  // token only with RAY_AUTH_MODE=token in its environment when libray_api.so is loaded (a setenv()
  // here is too late): unless the caller chose a mode, run again with token authentication, so
  // that both Ray baselines run the same way.
  if (!std::getenv("RAY_AUTH_MODE")) {
    ::setenv("RAY_AUTH_MODE", "token", 1);
    ::execv("/proc/self/exe", argv);
    std::printf("%s\n",
                json{{"error", std::string("re-exec: ") + std::strerror(errno)}}.dump().c_str());
    return 0;
  }
  int n = argc > 1 ? std::atoi(argv[1]) : 2000;
  if (n < 1) n = 2000;
  // Ray's processes (raylet, and the C++ worker it starts) inherit this environment: the worker
  // binary of the wheel finds libray_api.so only through LD_LIBRARY_PATH.
  if (*RAY_CPP_LIB_DIR) {
    const char* old = std::getenv("LD_LIBRARY_PATH");
    std::string path = RAY_CPP_LIB_DIR;
    if (old && *old) path += std::string(":") + old;
    ::setenv("LD_LIBRARY_PATH", path.c_str(), 1);
  }

  json out;
  ray_head head;
  std::string error;
  if (!head.start(120, &error)) {
    out = {{"error", error}};
  } else {
    try {
      ray::RayConfig config;
      config.address = head.address();
      config.code_search_path = {worker_library(argv[0])};
      ray::Init(config);
      out = measure(n);
      ray::Shutdown();
    } catch (const std::exception& e) {
      out = {{"error", std::string("Ray C++: ") + e.what()}};
    }
  }
  head.stop();
  std::printf("%s\n", out.dump().c_str());
  std::fflush(stdout);
  return 0;
}
