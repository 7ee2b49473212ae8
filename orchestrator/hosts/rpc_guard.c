/* pairctl-rpc-guard: ggml-rpc-server serves only the addresses in PAIRCTL_RPC_ALLOW.
 *
 * Why: ggml-rpc-server has no authentication and runs any graph a client sends; binding to one
 * address is not access control (issue 32 item 2). Preloaded into ggml-rpc-server by pairctl's
 * supervisor (LD_PRELOAD), this replaces accept()/accept4(): a connection whose peer is not an
 * allowed IPv4 address is reset (SO_LINGER 0) before the server reads a byte, and accept waits
 * for the next one, so a stray client never holds the server's one client slot. No root, no
 * firewall, nothing else installed on the host. Fails closed: no or a malformed list refuses all.
 * Built by pairctl on the operator's machine (orchestrator/hosts/rpc_guard.py); syscalls only,
 * no dlsym, so it loads on any glibc of the same architecture.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
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

int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
    for (;;) {
        struct sockaddr_storage peer;
        socklen_t plen = sizeof peer;
        memset(&peer, 0, sizeof peer);
        int c = (int)syscall(SYS_accept4, fd, (struct sockaddr *)&peer, &plen, flags);
        if (c < 0) return c;
        if (allowed(&peer)) {
            if (addr != NULL && len != NULL) {
                socklen_t k = *len < plen ? *len : plen;
                memcpy(addr, &peer, k);
                *len = plen;
            }
            return c;
        }
        char who[INET6_ADDRSTRLEN] = "?";
        if (peer.ss_family == AF_INET)
            inet_ntop(AF_INET, &((struct sockaddr_in *)&peer)->sin_addr, who, sizeof who);
        else
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&peer)->sin6_addr, who, sizeof who);
        fprintf(stderr, "pairctl-rpc-guard: refused a connection from %s (not in PAIRCTL_RPC_ALLOW)\n", who);
        fflush(stderr); /* said before the reset: whoever sees the reset can read why */
        struct linger l = {1, 0};
        setsockopt(c, SOL_SOCKET, SO_LINGER, &l, sizeof l);
        close(c);
    }
}

int accept(int fd, struct sockaddr *addr, socklen_t *len) { return accept4(fd, addr, len, 0); }
