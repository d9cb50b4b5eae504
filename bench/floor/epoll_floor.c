// The least a RESP server on epoll can spend per request: no parsing, no state, one read and
// one write per ready socket per loop, level-triggered epoll (the shape of redis-server's loop).
// Each request (every '*' read) is answered ":<counter>\r\n". A measuring stick for
// bench/floor.sh, not a server: it assumes whole requests arrive, as redis-benchmark sends them.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  int one = 1, listener = socket(AF_INET, SOCK_STREAM, 0);
  setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (bind(listener, (void *)&addr, sizeof addr) || listen(listener, 512)) return perror("bind"), 1;
  int ep = epoll_create1(0);
  struct epoll_event ev = {.events = EPOLLIN, .data.fd = listener}, ready[128];
  epoll_ctl(ep, EPOLL_CTL_ADD, listener, &ev);
  static char in[16384], out[65536];
  long long counter = 0;
  for (;;) {
    int n = epoll_wait(ep, ready, 128, -1);
    for (int i = 0; i < n; i++) {
      int fd = ready[i].data.fd;
      if (fd == listener) {
        int client = accept4(listener, 0, 0, SOCK_NONBLOCK);
        if (client < 0) continue;
        setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        struct epoll_event cev = {.events = EPOLLIN, .data.fd = client};
        epoll_ctl(ep, EPOLL_CTL_ADD, client, &cev);
        continue;
      }
      ssize_t got = read(fd, in, sizeof in);
      if (got <= 0) { close(fd); continue; }
      size_t len = 0;
      for (ssize_t k = 0; k < got; k++)
        if (in[k] == '*') len += sprintf(out + len, ":%lld\r\n", ++counter);
      if (len && write(fd, out, len) < 0) close(fd);
    }
  }
}
