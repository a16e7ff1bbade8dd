/* A paced SSE server that logs when it wrote each token: the truth a bench client is held to.
 *
 * One thread, one epoll loop, one absolute timer (timerfd, CLOCK_MONOTONIC, nanoseconds): every
 * streamed completion gets its first token TTFT after its request arrived, then one token every
 * INTERVAL, each due time on that fixed grid (a late write does not shift the next one). One
 * token per HTTP chunk, vLLM-shaped SSE (/v1/completions; usage in every chunk when the request
 * asks for continuous_usage_stats, then a usage chunk and [DONE]). TCP_NODELAY, so each write
 * leaves at once. GET /v1/models lists model "m".
 *
 *   cc -O2 -o paced_emitter paced_emitter.c
 *   ./paced_emitter PORT TTFT_US INTERVAL_US LOG     (PORT 0: any; prints "ready PORT")
 *
 * On SIGTERM or SIGINT it writes LOG, one line per token: request number, token number, due and
 * write times (CLOCK_MONOTONIC ns: Python's time.perf_counter on Linux), and exits.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONN 4096
#define IN_BUF 65536

typedef struct {
  int fd, streaming, usage_each;
  long req, tokens, sent;
  int64_t next_due;
  size_t in_len;
  char in[IN_BUF];
} conn_t;

typedef struct {
  long req, tok;
  int64_t due, wrote;
} entry_t;

static conn_t *conns[MAX_CONN];
static entry_t *log_buf;
static size_t log_len, log_cap;
static volatile sig_atomic_t done_flag;
static long next_req;
static int64_t ttft_ns, interval_ns;

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void on_signal(int sig) { (void)sig; done_flag = 1; }

/* write all of buf; a full socket buffer (a client not reading) blocks here: it shows in the log
 * as writes later than their due times */
static int write_all(int fd, const char *buf, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, buf, len);
    if (n > 0) {
      buf += n;
      len -= (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      struct pollfd p = {fd, POLLOUT, 0};
      poll(&p, 1, 1000);
      continue;
    }
    return -1;
  }
  return 0;
}

static int send_chunk(int fd, const char *data, size_t len) {
  char head[32];
  int h = snprintf(head, sizeof head, "%zx\r\n", len);
  char out[2048];
  if (len + (size_t)h + 2 > sizeof out) return -1;
  memcpy(out, head, (size_t)h);
  memcpy(out + h, data, len);
  memcpy(out + h + len, "\r\n", 2);
  return write_all(fd, out, (size_t)h + len + 2);
}

static const char *ID =
    "\"id\":\"cmpl-0123456789abcdef\",\"object\":\"text_completion\",\"created\":1796020874,"
    "\"model\":\"m\"";

static void close_conn(int ep, conn_t *c) {
  epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
  close(c->fd);
  conns[c->fd] = NULL;
  free(c);
}

static void log_token(conn_t *c, int64_t wrote) {
  if (log_len == log_cap) {
    log_cap = log_cap ? 2 * log_cap : 1 << 20;
    log_buf = realloc(log_buf, log_cap * sizeof *log_buf);
    if (!log_buf) exit(3);
  }
  log_buf[log_len++] = (entry_t){c->req, c->sent, c->next_due, wrote};
}

static int send_token(conn_t *c) {
  char ev[1024];
  int n;
  long k = c->sent + 1;
  if (c->usage_each)
    n = snprintf(ev, sizeof ev,
                 "data: {%s,\"choices\":[{\"index\":0,\"text\":\" tok\",\"logprobs\":null,"
                 "\"finish_reason\":null,\"stop_reason\":null}],\"usage\":{\"prompt_tokens\":8,"
                 "\"total_tokens\":%ld,\"completion_tokens\":%ld}}\n\n",
                 ID, 8 + k, k);
  else
    n = snprintf(ev, sizeof ev,
                 "data: {%s,\"choices\":[{\"index\":0,\"text\":\" tok\",\"logprobs\":null,"
                 "\"finish_reason\":null,\"stop_reason\":null}],\"usage\":null}\n\n",
                 ID);
  if (send_chunk(c->fd, ev, (size_t)n) < 0) return -1;
  log_token(c, now_ns());
  c->sent = k;
  c->next_due += interval_ns;
  if (c->sent < c->tokens) return 0;
  n = snprintf(ev, sizeof ev,
               "data: {%s,\"choices\":[],\"usage\":{\"prompt_tokens\":8,\"total_tokens\":%ld,"
               "\"completion_tokens\":%ld}}\n\n",
               ID, 8 + c->tokens, c->tokens);
  if (send_chunk(c->fd, ev, (size_t)n) < 0) return -1;
  if (send_chunk(c->fd, "data: [DONE]\n\n", 14) < 0) return -1;
  if (write_all(c->fd, "0\r\n\r\n", 5) < 0) return -1;
  c->streaming = 0;
  return 0;
}

/* a whole request in c->in: answer it (a completion starts streaming); returns bytes used */
static long handle_request(conn_t *c) {
  char *end = memmem(c->in, c->in_len, "\r\n\r\n", 4);
  if (!end) return 0;
  size_t head = (size_t)(end - c->in) + 4;
  long body = 0;
  char *cl = memmem(c->in, head, "ontent-Length:", 14);
  if (!cl) cl = memmem(c->in, head, "ontent-length:", 14);
  if (cl) body = strtol(cl + 14, NULL, 10);
  if (c->in_len < head + (size_t)body) return 0;
  if (strncmp(c->in, "GET /v1/models", 14) == 0) {
    const char *b = "{\"object\":\"list\",\"data\":[{\"id\":\"m\",\"object\":\"model\"}]}";
    char out[256];
    int n = snprintf(out, sizeof out,
                     "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                     "content-length: %zu\r\n\r\n%s", strlen(b), b);
    write_all(c->fd, out, (size_t)n);
  } else if (strncmp(c->in, "GET", 3) == 0) {
    write_all(c->fd, "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n", 45);
  } else {
    char *js = c->in + head;
    char saved = js[body];
    js[body] = 0;
    char *mt = strstr(js, "\"max_tokens\"");
    c->tokens = mt ? strtol(strchr(mt, ':') + 1, NULL, 10) : 16;
    if (c->tokens < 1) c->tokens = 1;
    c->usage_each = strstr(js, "continuous_usage_stats\": true") != NULL ||
                    strstr(js, "continuous_usage_stats\":true") != NULL;
    js[body] = saved;
    const char *h = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    "transfer-encoding: chunked\r\n\r\n";
    write_all(c->fd, h, strlen(h));
    c->req = next_req++;
    c->sent = 0;
    c->streaming = 1;
    c->next_due = now_ns() + ttft_ns;
  }
  return (long)(head + (size_t)body);
}

static void arm(int tfd) {
  int64_t due = INT64_MAX;
  for (int i = 0; i < MAX_CONN; i++)
    if (conns[i] && conns[i]->streaming && conns[i]->next_due < due) due = conns[i]->next_due;
  struct itimerspec its = {0};
  if (due != INT64_MAX) {
    its.it_value.tv_sec = due / 1000000000LL;
    its.it_value.tv_nsec = due % 1000000000LL;
    if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0) its.it_value.tv_nsec = 1;
  }
  timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, NULL);
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s PORT TTFT_US INTERVAL_US LOG\n", argv[0]);
    return 2;
  }
  ttft_ns = atoll(argv[2]) * 1000LL;
  interval_ns = atoll(argv[3]) * 1000LL;
  signal(SIGTERM, on_signal);
  signal(SIGINT, on_signal);
  signal(SIGPIPE, SIG_IGN);
  int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1]))};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 4096)) {
    perror("bind/listen");
    return 1;
  }
  socklen_t al = sizeof a;
  getsockname(ls, (struct sockaddr *)&a, &al);
  printf("ready %d\n", ntohs(a.sin_port));
  fflush(stdout);
  int ep = epoll_create1(0);
  int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK);
  struct epoll_event ev = {.events = EPOLLIN, .data.fd = ls};
  epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
  ev.data.fd = tfd;
  epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &ev);
  struct epoll_event evs[256];
  while (!done_flag) {
    int n = epoll_wait(ep, evs, 256, -1);
    if (n < 0) continue; /* EINTR: the signal flag is checked above */
    for (int i = 0; i < n; i++) {
      int fd = evs[i].data.fd;
      if (fd == ls) {
        int cfd;
        while ((cfd = accept4(ls, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
          if (cfd >= MAX_CONN) {
            close(cfd);
            continue;
          }
          setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          conn_t *c = calloc(1, sizeof *c);
          c->fd = cfd;
          conns[cfd] = c;
          struct epoll_event ce = {.events = EPOLLIN, .data.fd = cfd};
          epoll_ctl(ep, EPOLL_CTL_ADD, cfd, &ce);
        }
      } else if (fd == tfd) {
        uint64_t ticks;
        if (read(tfd, &ticks, sizeof ticks) < 0) { /* nothing */ }
      } else {
        conn_t *c = conns[fd];
        if (!c) continue;
        ssize_t r = read(fd, c->in + c->in_len, IN_BUF - 1 - c->in_len);
        if (r <= 0) {
          if (r < 0 && errno == EAGAIN) continue;
          close_conn(ep, c);
          continue;
        }
        c->in_len += (size_t)r;
        long used;
        while (!c->streaming && (used = handle_request(c)) > 0) {
          memmove(c->in, c->in + used, c->in_len - (size_t)used);
          c->in_len -= (size_t)used;
        }
      }
    }
    /* every token that is due, in due order per stream */
    int64_t t = now_ns();
    for (int i = 0; i < MAX_CONN; i++) {
      conn_t *c = conns[i];
      while (c && c->streaming && c->next_due <= t) {
        if (send_token(c) < 0) {
          close_conn(ep, c);
          c = NULL;
          break;
        }
        if (!c->streaming && c->in_len) { /* a pipelined next request */
          long used = handle_request(c);
          if (used > 0) {
            memmove(c->in, c->in + used, c->in_len - (size_t)used);
            c->in_len -= (size_t)used;
          }
        }
      }
    }
    arm(tfd);
  }
  FILE *f = fopen(argv[4], "w");
  if (!f) return 1;
  for (size_t i = 0; i < log_len; i++)
    fprintf(f, "%ld %ld %lld %lld\n", log_buf[i].req, log_buf[i].tok, (long long)log_buf[i].due,
            (long long)log_buf[i].wrote);
  fclose(f);
  return 0;
}
