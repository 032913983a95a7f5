// CAF's TLS sessions read ahead (actors/runtime.cpp): one read() takes every record the socket
// holds, and SSL_pending() keeps saying "more" while records read ahead wait undecrypted in
// OpenSSL's buffer — otherwise CAF's read loop, which stops after 50 reads unless SSL_pending()
// covers what it still wants, could leave them there with the socket empty and no event to come.

#include <gtest/gtest.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fcntl.h>

#include <memory>
#include <string>

#include "actors/cluster_tls.hpp"

namespace weft::actors {
namespace {

using ctx_ptr = std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)>;
using ssl_ptr = std::unique_ptr<SSL, decltype(&SSL_free)>;

ctx_ptr context(const tls_options& tls) {
  ctx_ptr ctx(SSL_CTX_new(TLS_method()), &SSL_CTX_free);
  EXPECT_EQ(SSL_CTX_use_certificate_chain_file(ctx.get(), tls.certificate.c_str()), 1);
  EXPECT_EQ(SSL_CTX_use_PrivateKey_file(ctx.get(), tls.key.c_str(), SSL_FILETYPE_PEM), 1);
  return ctx;
}

TEST(tls_read_ahead, records_read_ahead_count_as_pending) {
  auto tls = derive_cluster_tls(cluster_secret{"read-ahead-test-secret-0123456789"});
  ASSERT_TRUE(tls.ok()) << tls.error().message;
  auto server_ctx = context(*tls);
  auto client_ctx = context(*tls);
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  for (int fd : fds) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  ssl_ptr server(SSL_new(server_ctx.get()), &SSL_free);
  ssl_ptr client(SSL_new(client_ctx.get()), &SSL_free);
  // As CAF does: SSL_set_fd. weft's SSL_set_fd turns read-ahead on.
  ASSERT_EQ(SSL_set_fd(server.get(), fds[0]), 1);
  ASSERT_EQ(SSL_set_fd(client.get(), fds[1]), 1);
  EXPECT_EQ(SSL_get_read_ahead(client.get()), 1);
  SSL_set_accept_state(server.get());
  SSL_set_connect_state(client.get());
  bool server_done = false;
  bool client_done = false;
  for (int i = 0; i < 100 && !(server_done && client_done); ++i) {
    if (!client_done) client_done = SSL_do_handshake(client.get()) == 1;
    if (!server_done) server_done = SSL_do_handshake(server.get()) == 1;
  }
  ASSERT_TRUE(server_done && client_done) << "handshake";

  // Three records, all in the client's socket before it reads.
  for (const char* text : {"aaaa", "bbbb", "cccc"}) ASSERT_EQ(SSL_write(server.get(), text, 4), 4);
  char buf[16] = {};
  // (TLS 1.3 session tickets come first; SSL_read handles them.)
  ASSERT_EQ(SSL_read(client.get(), buf, 2), 2);
  EXPECT_EQ(std::string(buf, 2), "aa");
  ASSERT_EQ(SSL_read(client.get(), buf, 2), 2);
  EXPECT_EQ(std::string(buf, 2), "aa");
  // The first record is consumed; the other two were read ahead and wait in OpenSSL's buffer.
  EXPECT_GT(SSL_pending(client.get()), 4) << "records read ahead must count as pending";
  ASSERT_EQ(SSL_read(client.get(), buf, 4), 4);
  EXPECT_EQ(std::string(buf, 4), "bbbb");
  ASSERT_EQ(SSL_read(client.get(), buf, 4), 4);
  EXPECT_EQ(std::string(buf, 4), "cccc");
  // Nothing left anywhere: "no more", and the next read would block.
  EXPECT_EQ(SSL_pending(client.get()), 0);
  EXPECT_LE(SSL_read(client.get(), buf, 4), 0);
  EXPECT_EQ(SSL_get_error(client.get(), -1), SSL_ERROR_WANT_READ);
  ::close(fds[0]);
  ::close(fds[1]);
}

}  // namespace
}  // namespace weft::actors
