// The same measuring stick on io_uring (liburing): one recv kept outstanding per connection;
// its completion queues the reply's send and the next recv, and one io_uring_submit_and_wait
// per loop submits everything. Set up with SINGLE_ISSUER | DEFER_TASKRUN (completions run in
// this thread when it waits, the cheapest mode here; without it each request cost 1.6x more).
#include <arpa/inet.h>
#include <liburing.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_FD 4096
enum { ACCEPT = 1, RECV = 2, SEND = 3 };
static char in[MAX_FD][4096], out[MAX_FD][8192];
static struct io_uring ring;

static void *tag(long kind, int fd) { return (void *)((kind << 32) | fd); }

static void recv_on(int fd) {
  struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
  io_uring_prep_recv(sqe, fd, in[fd], sizeof in[fd], 0);
  io_uring_sqe_set_data(sqe, tag(RECV, fd));
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  int one = 1, listener = socket(AF_INET, SOCK_STREAM, 0);
  setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (bind(listener, (void *)&addr, sizeof addr) || listen(listener, 512)) return perror("bind"), 1;
  struct io_uring_params params = {.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN};
  if (io_uring_queue_init_params(4096, &ring, &params)) return perror("io_uring"), 1;
  struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
  io_uring_prep_multishot_accept(sqe, listener, 0, 0, 0);
  io_uring_sqe_set_data(sqe, tag(ACCEPT, listener));
  long long counter = 0;
  for (;;) {
    io_uring_submit_and_wait(&ring, 1);
    struct io_uring_cqe *cqe;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(&ring, head, cqe) {
      seen++;
      long data = (long)io_uring_cqe_get_data(cqe);
      int kind = data >> 32, fd = data & 0xffffffff;
      if (kind == ACCEPT && cqe->res >= 0 && cqe->res < MAX_FD) {
        setsockopt(cqe->res, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        recv_on(cqe->res);
      } else if (kind == RECV) {
        if (cqe->res <= 0) { close(fd); continue; }
        size_t len = 0;
        for (int k = 0; k < cqe->res; k++)
          if (in[fd][k] == '*') len += sprintf(out[fd] + len, ":%lld\r\n", ++counter);
        struct io_uring_sqe *send = io_uring_get_sqe(&ring);
        io_uring_prep_send(send, fd, out[fd], len, 0);
        io_uring_sqe_set_data(send, tag(SEND, fd));
        recv_on(fd);
      }
    }
    io_uring_cq_advance(&ring, seen);
  }
}
