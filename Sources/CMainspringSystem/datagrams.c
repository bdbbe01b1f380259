// recvmmsg(2) and sendmmsg(2) for System/DatagramCalls.swift: glibc declares them (and struct
// mmsghdr) only under _GNU_SOURCE, which must come before any system header.
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "CMainspringSystem.h"

#define MS_DATAGRAM_BATCH_LIMIT 64

int ms_receive_datagrams(int fd, unsigned char *buffers, size_t size, unsigned count, size_t *lengths,
                         unsigned char *truncated, unsigned char *addresses, unsigned *address_lengths) {
    if (count > MS_DATAGRAM_BATCH_LIMIT) count = MS_DATAGRAM_BATCH_LIMIT;
    struct mmsghdr messages[MS_DATAGRAM_BATCH_LIMIT];
    struct iovec vectors[MS_DATAGRAM_BATCH_LIMIT];
    memset(messages, 0, sizeof(struct mmsghdr) * count);
    for (unsigned i = 0; i < count; i++) {
        vectors[i].iov_base = buffers + (size_t)i * size;
        vectors[i].iov_len = size;
        messages[i].msg_hdr.msg_iov = &vectors[i];
        messages[i].msg_hdr.msg_iovlen = 1;
        messages[i].msg_hdr.msg_name = addresses + (size_t)i * MS_DATAGRAM_ADDRESS_SIZE;
        messages[i].msg_hdr.msg_namelen = MS_DATAGRAM_ADDRESS_SIZE;
    }
    int received;
    do {
        // MSG_TRUNC: each msg_len is the datagram's real length, even when it did not fit.
        received = recvmmsg(fd, messages, count, MSG_DONTWAIT | MSG_TRUNC, NULL);
    } while (received < 0 && errno == EINTR);
    for (int i = 0; i < received; i++) {
        lengths[i] = messages[i].msg_len;
        truncated[i] = (messages[i].msg_hdr.msg_flags & MSG_TRUNC) != 0 || messages[i].msg_len > size;
        address_lengths[i] = messages[i].msg_hdr.msg_namelen;
    }
    return received;
}

int ms_send_datagrams(int fd, const unsigned char *payload, const size_t *sizes, unsigned count,
                      const unsigned char *addresses, const unsigned *address_lengths) {
    if (count > MS_DATAGRAM_BATCH_LIMIT) count = MS_DATAGRAM_BATCH_LIMIT;
    struct mmsghdr messages[MS_DATAGRAM_BATCH_LIMIT];
    struct iovec vectors[MS_DATAGRAM_BATCH_LIMIT];
    memset(messages, 0, sizeof(struct mmsghdr) * count);
    size_t offset = 0;
    for (unsigned i = 0; i < count; i++) {
        vectors[i].iov_base = (void *)(payload + offset);
        vectors[i].iov_len = sizes[i];
        offset += sizes[i];
        messages[i].msg_hdr.msg_iov = &vectors[i];
        messages[i].msg_hdr.msg_iovlen = 1;
        if (address_lengths[i] > 0) {
            messages[i].msg_hdr.msg_name = (void *)(addresses + (size_t)i * MS_DATAGRAM_ADDRESS_SIZE);
            messages[i].msg_hdr.msg_namelen = address_lengths[i];
        }
    }
    int sent;
    do {
        sent = sendmmsg(fd, messages, count, MSG_DONTWAIT | MSG_NOSIGNAL);
    } while (sent < 0 && errno == EINTR);
    return sent;
}
