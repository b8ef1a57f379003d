// The bounds of a loaderxd client's timeouts (client::LoaderSpec, client.h),
// in a header of their own so that every build has them: the Python module
// exposes them also where it is built without the client.
//
// Thread-safety: constants.
#pragma once

#include <chrono>

namespace loaderx::client {

// Liveness (protocol 1.2): a wait that hears nothing from a daemon that
// announced heartbeats for this long returns Status::Daemon (a SIGSTOPped,
// deadlocked or swapped-out loaderxd). LoaderSpec::liveness_timeout sets it
// per loader, at least kMinLivenessTimeout: several heartbeats must fit, so
// a daemon that is merely busy is never mistaken for a dead one.
inline constexpr std::chrono::milliseconds kDefaultLivenessTimeout{10000};
// Four of the daemon's heartbeat intervals (protocol 1.2: 250 ms; client.cc
// static_asserts the relation against the protocol's constant).
inline constexpr std::chrono::milliseconds kMinLivenessTimeout{1000};
static_assert(kMinLivenessTimeout <= kDefaultLivenessTimeout);
// The shortest LoaderSpec::group_timeout, and the longest of either timeout.
inline constexpr std::chrono::milliseconds kMinGroupTimeout{100};
inline constexpr std::chrono::milliseconds kMaxTimeout{86400 * 1000};

}  // namespace loaderx::client
