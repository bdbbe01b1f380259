// The C surface Mainspring imports. Only the core (Sources/Mainspring/Libevent/, and the socket
// types in Sources/Mainspring/System/SocketTypes.swift) and MainspringTLS's OpenSSL bufferevents
// (Sources/MainspringTLS/OpenSSL/) import this module; the benchmark's C baselines depend on it
// for libevent's headers and libraries.
// Helpers here are limited to what Swift cannot import directly (macros, variadic calls); the
// operating system's own such calls are in Sources/CMainspringSystem.
#ifndef MAINSPRING_CLIBEVENT_SHIM_H
#define MAINSPRING_CLIBEVENT_SHIM_H

// libevent's event-config.h defines _GNU_SOURCE. Were glibc's feature macros settled by that,
// this module would parse glibc's headers differently from the Glibc and Dispatch modules
// (fd_set's fields, say) and Clang would refuse the mismatch. Including <features.h> first
// settles them the way every other module sees them.
#include <features.h>

#include <event2/event.h>
#include <event2/util.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/listener.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#endif
