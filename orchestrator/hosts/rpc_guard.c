/* pairctl-rpc-guard: ggml-rpc-server serves only the native host's pairctl-run llama-server.
 *
 * Why: ggml-rpc-server has no authentication and runs any graph a client sends; binding to one
 * address is not access control (issue 32 item 2), and an address is not a user: any local user
 * of the native host connects from its address (issue 49 item 4). Preloaded into ggml-rpc-server
 * by pairctl's supervisor (LD_PRELOAD), this replaces accept()/accept4(): a peer that is not an
 * allowed IPv4 address is reset (SO_LINGER 0); an allowed one is then sent 32 random bytes and
 * must answer HMAC-SHA256(route key, challenge) within AUTH_WAIT_MS, or it is reset too, all
 * before the server reads a byte, so a stranger never gets a HELLO answer nor holds the server's
 * one client slot. The route key (PAIRCTL_RPC_KEY names its file: secrets/rpc.key, 0400 and the
 * service user's on both hosts, never in argv) is what the native side proves: the same file,
 * preloaded into llama-server with PAIRCTL_RPC_DIAL=ADDRESS:PORT, replaces connect() to answer
 * the challenge. A local stranger cannot read the key, and cannot borrow llama-server's
 * connections (another uid: no ptrace, no /proc/PID/fd). Fails closed: no or a malformed list,
 * or a key file named but unreadable, refuses all. SIGPIPE is ignored in the server: a client
 * gone mid-answer ends that connection, not the server. Built by pairctl on the operator's
 * machine (orchestrator/hosts/rpc_guard.py); syscalls and libc only, no dlsym, so it loads on
 * any glibc of the same architecture.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static int allowed(const struct sockaddr_storage *peer) {
    struct in_addr a;
    if (peer->ss_family == AF_INET) {
        a = ((const struct sockaddr_in *)peer)->sin_addr;
    } else if (peer->ss_family == AF_INET6) {
        const struct in6_addr *a6 = &((const struct sockaddr_in6 *)peer)->sin6_addr;
        if (!IN6_IS_ADDR_V4MAPPED(a6)) return 0;
        memcpy(&a, &a6->s6_addr[12], 4);
    } else {
        return 1; /* not TCP/IP (a unix socket): not what this guards */
    }
    const char *list = getenv("PAIRCTL_RPC_ALLOW");
    if (list == NULL) return 0;
    char buf[512];
    size_t n = strlen(list);
    if (n == 0 || n >= sizeof buf) return 0;
    memcpy(buf, list, n + 1);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        struct in_addr want;
        if (inet_pton(AF_INET, tok, &want) == 1 && want.s_addr == a.s_addr) return 1;
    }
    return 0;
}

/* --- the route's key: HMAC-SHA256(key, challenge), proved after the address rule (issue 49) --- */
static const unsigned K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))
typedef struct { unsigned h[8]; unsigned char buf[64]; size_t n, total; } sha256_t;
static void sha_block(sha256_t *s, const unsigned char *p) {
    unsigned w[64], a[8];
    for (int i = 0; i < 16; i++) w[i] = (unsigned)p[4 * i] << 24 | p[4 * i + 1] << 16 | p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        unsigned s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        unsigned s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    memcpy(a, s->h, sizeof a);
    for (int i = 0; i < 64; i++) {
        unsigned t1 = a[7] + (ROR(a[4], 6) ^ ROR(a[4], 11) ^ ROR(a[4], 25)) + ((a[4] & a[5]) ^ (~a[4] & a[6])) + K256[i] + w[i];
        unsigned t2 = (ROR(a[0], 2) ^ ROR(a[0], 13) ^ ROR(a[0], 22)) + ((a[0] & a[1]) ^ (a[0] & a[2]) ^ (a[1] & a[2]));
        memmove(a + 1, a, 7 * sizeof a[0]);
        a[4] += t1;
        a[0] = t1 + t2;
    }
    for (int i = 0; i < 8; i++) s->h[i] += a[i];
}
static void sha_init(sha256_t *s) {
    static const unsigned h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, h0, sizeof h0);
    s->n = s->total = 0;
}
static void sha_add(sha256_t *s, const unsigned char *p, size_t n) {
    s->total += n;
    while (n--) {
        s->buf[s->n++] = *p++;
        if (s->n == 64) { sha_block(s, s->buf); s->n = 0; }
    }
}
static void sha_end(sha256_t *s, unsigned char out[32]) {
    unsigned long long bits = (unsigned long long)s->total * 8;
    unsigned char pad = 0x80, len[8];
    sha_add(s, &pad, 1);
    pad = 0;
    while (s->n != 56) sha_add(s, &pad, 1);
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)(bits >> (56 - 8 * i));
    sha_add(s, len, 8);
    for (int i = 0; i < 32; i++) out[i] = (unsigned char)(s->h[i / 4] >> (24 - 8 * (i % 4)));
}
static void hmac(const unsigned char key[32], const unsigned char msg[32], unsigned char out[32]) {
    unsigned char pad[64], inner[32];
    sha256_t s;
    for (int o = 0; o < 2; o++) {
        memset(pad, o ? 0x5c : 0x36, sizeof pad);
        for (int i = 0; i < 32; i++) pad[i] ^= key[i];
        sha_init(&s);
        sha_add(&s, pad, 64);
        sha_add(&s, o ? inner : msg, 32);
        sha_end(&s, o ? out : inner);
    }
}

#define AUTH_LEN 32
/* The answer is one HMAC computed by the client right after connect() returned, plus one round
 * trip: milliseconds on any network pairctl pairs hosts on. A peer silent for 2 s is reset; it
 * never delays another: every pending challenge is waited on at once (see accept4). */
#define AUTH_WAIT_MS 2000

static int read_key(unsigned char key[AUTH_LEN]) {
    const char *path = getenv("PAIRCTL_RPC_KEY");
    if (path == NULL) return 0;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return 0;
    unsigned char b[AUTH_LEN + 1];
    size_t n = 0;
    ssize_t k;
    while (n < sizeof b && (k = read(fd, b + n, sizeof b - n)) > 0) n += (size_t)k;
    close(fd);
    if (n != AUTH_LEN) return 0;
    memcpy(key, b, AUTH_LEN);
    return 1;
}

static long ms_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000L + t.tv_nsec / 1000000L;
}

/* N bytes in (out=0) or out, all of them before DEADLINE (CLOCK_MONOTONIC ms), or 0 */
static int xfer(int fd, unsigned char *b, size_t n, int out, long deadline) {
    size_t done = 0;
    while (done < n) {
        long left = deadline - ms_now();
        struct pollfd p = {fd, (short)(out ? POLLOUT : POLLIN), 0};
        if (left <= 0 || poll(&p, 1, (int)left) <= 0) return 0;
        ssize_t k = out ? send(fd, b + done, n - done, MSG_NOSIGNAL) : recv(fd, b + done, n - done, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return 0;
        done += (size_t)k;
    }
    return 1;
}

static int prove(int fd) {
    unsigned char key[AUTH_LEN], chal[AUTH_LEN], mac[AUTH_LEN];
    long deadline = ms_now() + AUTH_WAIT_MS;
    if (!read_key(key) || !xfer(fd, chal, sizeof chal, 0, deadline)) return 0;
    hmac(key, chal, mac);
    return xfer(fd, mac, sizeof mac, 1, deadline);
}

/* this process dials the RPC server (llama-server, a probe): connect() there answers the challenge */
static int dials(const struct sockaddr *addr, socklen_t len) {
    const char *dial = getenv("PAIRCTL_RPC_DIAL");
    if (dial == NULL || addr == NULL || addr->sa_family != AF_INET || len < sizeof(struct sockaddr_in)) return 0;
    const struct sockaddr_in *in = (const struct sockaddr_in *)addr;
    char host[INET_ADDRSTRLEN];
    const char *colon = strrchr(dial, ':');
    if (colon == NULL || (size_t)(colon - dial) >= sizeof host) return 0;
    memcpy(host, dial, (size_t)(colon - dial));
    host[colon - dial] = 0;
    struct in_addr want;
    return inet_pton(AF_INET, host, &want) == 1 && want.s_addr == in->sin_addr.s_addr &&
           ntohs(in->sin_port) == atoi(colon + 1);
}

int connect(int fd, const struct sockaddr *addr, socklen_t len) {
    int r = (int)syscall(SYS_connect, fd, addr, len);
    if (!dials(addr, len)) return r;
    if (r != 0 && errno == EINPROGRESS) { /* a non-blocking socket: the proof needs the connection */
        struct pollfd p = {fd, POLLOUT, 0};
        int err = 0;
        socklen_t el = sizeof err;
        if (poll(&p, 1, AUTH_WAIT_MS) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err == 0) r = 0;
        else errno = err ? err : ETIMEDOUT;
    }
    if (r != 0) return r;
    if (prove(fd)) return 0;
    errno = ECONNREFUSED;
    return -1;
}

static int guarding(void) { return getenv("PAIRCTL_RPC_ALLOW") != NULL || getenv("PAIRCTL_RPC_DIAL") == NULL; }

__attribute__((constructor)) static void guard_init(void) {
    if (getenv("PAIRCTL_RPC_ALLOW") != NULL) signal(SIGPIPE, SIG_IGN);
}

static void refuse(int c, const struct sockaddr_storage *peer, const char *why) {
    char who[INET6_ADDRSTRLEN] = "?";
    if (peer->ss_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)peer)->sin_addr, who, sizeof who);
    else
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)peer)->sin6_addr, who, sizeof who);
    fprintf(stderr, "pairctl-rpc-guard: refused a connection from %s (%s)\n", who, why);
    fflush(stderr); /* said before the reset: whoever sees the reset can read why */
    struct linger l = {1, 0};
    setsockopt(c, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    close(c);
}

/* Allowed peers sent a challenge and not answered yet (issue 49): one silent peer must not hold
 * up the next, so accept4 waits on the listener and every pending answer at once (poll), each
 * with its own deadline, and returns the first connection that proves the key. The table is
 * bounded; a peer past it is reset at once (a flood of silent peers is a denial of service a
 * firewall answers, not this shim). ggml-rpc-server calls accept from one thread. */
#define PENDING_MAX 32
static struct pending {
    int fd, flags;
    long deadline;
    size_t got;
    unsigned char chal[AUTH_LEN], ans[AUTH_LEN];
    struct sockaddr_storage peer;
    socklen_t plen;
} pend[PENDING_MAX];
static int npend;

static void drop(int i) { pend[i] = pend[--npend]; }

/* a new connection from an allowed address: challenged and pending (1), or refused (0) */
static int challenge(int c, const struct sockaddr_storage *peer, socklen_t plen, int flags) {
    struct pending *p = &pend[npend];
    if (npend == PENDING_MAX) return refuse(c, peer, "too many peers owe a proof"), 0;
    if (syscall(SYS_getrandom, p->chal, sizeof p->chal, 0) != (long)sizeof p->chal ||
        send(c, p->chal, sizeof p->chal, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof p->chal)
        return refuse(c, peer, "no proof of the route's key"), 0;
    p->fd = c, p->flags = flags, p->deadline = ms_now() + AUTH_WAIT_MS, p->got = 0, p->peer = *peer, p->plen = plen;
    npend++;
    return 1;
}

/* pending I has bytes (or an end): 1 when its answer is complete and right (it leaves the table
 * either way once it is decided) */
static int answered(int i, unsigned char key[AUTH_LEN]) {
    struct pending *p = &pend[i];
    ssize_t k = recv(p->fd, p->ans + p->got, AUTH_LEN - p->got, MSG_DONTWAIT);
    if (k < 0 && (errno == EAGAIN || errno == EINTR)) return 0;
    if (k > 0) p->got += (size_t)k;
    if (k > 0 && p->got < AUTH_LEN) return 0;
    unsigned char want[AUTH_LEN], diff = k <= 0;
    hmac(key, p->chal, want);
    for (int j = 0; j < AUTH_LEN; j++) diff |= (unsigned char)(want[j] ^ p->ans[j]); /* constant time */
    if (diff == 0) return 1;
    refuse(p->fd, &p->peer, "no proof of the route's key");
    drop(i);
    return 0;
}

/* the connection to the program, as accept4(FLAGS) would have returned it */
static int hand_over(const struct pending *p, struct sockaddr *addr, socklen_t *len) {
    if (!(p->flags & SOCK_NONBLOCK)) fcntl(p->fd, F_SETFL, fcntl(p->fd, F_GETFL) & ~O_NONBLOCK);
    if (!(p->flags & SOCK_CLOEXEC)) fcntl(p->fd, F_SETFD, 0); /* held close-on-exec while pending */
    if (addr != NULL && len != NULL) {
        socklen_t k = *len < p->plen ? *len : p->plen;
        memcpy(addr, &p->peer, k);
        *len = p->plen;
    }
    return p->fd;
}

/* pending I proved the key: out of the table and to the program */
static int take(int i, struct sockaddr *addr, socklen_t *len) {
    struct pending p = pend[i];
    drop(i);
    return hand_over(&p, addr, len);
}

int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
    if (!guarding()) return (int)syscall(SYS_accept4, fd, addr, len, flags); /* a dialling process */
    unsigned char key[AUTH_LEN];
    int keyed = getenv("PAIRCTL_RPC_KEY") != NULL, have_key = 0;
    int lflags = fcntl(fd, F_GETFL), blocking = lflags >= 0 && !(lflags & O_NONBLOCK);
    for (;;) {
        struct pollfd pf[PENDING_MAX + 1];
        long now = ms_now(), wait = -1;
        have_key = keyed && read_key(key); /* read at every wake: a key rotated meanwhile is the one asked */
        for (; keyed && !have_key && npend > 0; drop(npend - 1)) /* no key to check proofs against */
            refuse(pend[npend - 1].fd, &pend[npend - 1].peer, "no proof of the route's key");
        for (int i = npend - 1; i >= 0; i--) { /* past its deadline: an answer that came in time first */
            if (pend[i].deadline <= now) {
                int fdi = pend[i].fd;
                if (have_key && answered(i, key)) return take(i, addr, len);
                if (i < npend && pend[i].fd == fdi) { /* still owed (answered() drops a wrong one) */
                    refuse(pend[i].fd, &pend[i].peer, "no proof of the route's key");
                    drop(i);
                }
            }
        }
        pf[0] = (struct pollfd){fd, POLLIN, 0};
        for (int i = 0; i < npend; i++) {
            pf[i + 1] = (struct pollfd){pend[i].fd, POLLIN, 0};
            if (wait < 0 || pend[i].deadline - now < wait) wait = pend[i].deadline - now;
        }
        int n = npend;
        if (poll(pf, (nfds_t)n + 1, blocking ? (int)wait : 0) < 0 && errno != EINTR) return -1;
        for (int i = n - 1; i >= 0; i--) /* backwards: drop() moves the last entry into i */
            if (pf[i + 1].revents && have_key && answered(i, key)) return take(i, addr, len);
        if (pf[0].revents & POLLNVAL) { /* not a listener (any more): as accept4 would say */
            errno = EBADF;
            return -1;
        }
        if (pf[0].revents & (POLLIN | POLLERR | POLLHUP)) { /* an error or an end: accept4 names it */
            struct sockaddr_storage peer;
            socklen_t plen = sizeof peer;
            memset(&peer, 0, sizeof peer);
            /* the listener may have lost that connection meanwhile: never block in accept here */
            fcntl(fd, F_SETFL, lflags | O_NONBLOCK);
            /* close-on-exec while the guard holds it: a process the program starts meanwhile (another
             * thread's fork and exec) must not inherit a peer that has not proved the key */
            int c = (int)syscall(SYS_accept4, fd, (struct sockaddr *)&peer, &plen, flags | SOCK_NONBLOCK | SOCK_CLOEXEC);
            int err = errno;
            fcntl(fd, F_SETFL, lflags);
            errno = err;
            if (c < 0 && errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) return -1;
            if (c < 0 && !(pf[0].revents & POLLIN)) { /* an end poll keeps saying, that accept4 did not */
                errno = EINVAL;
                return -1;
            }
            if (c >= 0 && !allowed(&peer)) refuse(c, &peer, "not in PAIRCTL_RPC_ALLOW");
            else if (c >= 0 && keyed && !have_key) refuse(c, &peer, "no proof of the route's key");
            else if (c >= 0 && !keyed) /* served by address alone (no key named) */
                return hand_over(&(struct pending){.fd = c, .flags = flags, .peer = peer, .plen = plen}, addr, len);
            else if (c >= 0) challenge(c, &peer, plen, flags);
        } else if (!blocking) { /* a non-blocking listener: nothing proved yet */
            errno = EAGAIN;
            return -1;
        }
    }
}

int accept(int fd, struct sockaddr *addr, socklen_t *len) { return accept4(fd, addr, len, 0); }
