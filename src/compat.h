/*
** compat.h - the Lua version differences async_hooks cares about.
** Everything version-dependent goes here; the rest of src/ is plain 5.4.
*/
#ifndef AH_COMPAT_H
#define AH_COMPAT_H

#include "lua.h"
#include "lauxlib.h"

#if LUA_VERSION_NUM < 504
#error "async_hooks needs Lua 5.4 (LuaJIT/5.1 support is planned, not done)"
#endif

/* lua_resetthread changed signature in 5.4.5 and became lua_closethread
** in 5.4.6. */
#if LUA_VERSION_RELEASE_NUM >= 50406
#define ah_closethread(co, from) lua_closethread((co), (from))
#elif LUA_VERSION_RELEASE_NUM == 50405
#define ah_closethread(co, from) lua_resetthread((co), (from))
#else
#define ah_closethread(co, from) ((void)(from), lua_resetthread(co))
#endif

/* running inside a finalizer (__gc): since 5.4.4 lua_gc refuses every
** option there (returns -1); earlier 5.4 releases cannot tell (destroys
** queued by a user's finalizer may then be delivered inside it) */
#if LUA_VERSION_RELEASE_NUM >= 50404
#define ah_in_finalizer(L) (lua_gc((L), LUA_GCISRUNNING) < 0)
#else
#define ah_in_finalizer(L) ((void)(L), 0)
#endif

/* branch hints */
#if defined(__GNUC__) || defined(__clang__)
#define AH_NOINLINE __attribute__((noinline))
/* rarely run: placed apart from the hot paths (.text.unlikely), so that
** those stay short in the instruction cache */
#define AH_COLD __attribute__((noinline, cold))
#define AH_ALWAYS_INLINE inline __attribute__((always_inline))
#define ah_likely(x) __builtin_expect(((x) != 0), 1)
#define ah_unlikely(x) __builtin_expect(((x) != 0), 0)
#else
#define AH_NOINLINE
#define AH_COLD
#define AH_ALWAYS_INLINE
#define ah_likely(x) (x)
#define ah_unlikely(x) (x)
#endif

/* a pointer read and written by several OS threads (one Lua state each):
** a relaxed atomic access where the compiler has one */
#if defined(__GNUC__) || defined(__clang__)
#define ah_load_ptr(p) __atomic_load_n(&(p), __ATOMIC_RELAXED)
#define ah_store_ptr(p, v) __atomic_store_n(&(p), (v), __ATOMIC_RELAXED)
#else
#define ah_load_ptr(p) (p)
#define ah_store_ptr(p, v) ((p) = (v))
#endif

/* the module's one exported symbol (everything else is hidden) */
#if defined(__GNUC__) || defined(__clang__)
#define AH_EXPORT __attribute__((visibility("default")))
#elif defined(_WIN32)
#define AH_EXPORT __declspec(dllexport)
#else
#define AH_EXPORT
#endif

/* One pointer-sized raw slot per lua_State, reserved by the manual for the
** host.  Unless the host declares that it uses it (see slots.c's
** host_owns_extra), async_hooks stores the index of the thread's context
** slot there (never a pointer: a value it did not write is validated, never
** dereferenced); otherwise it never writes it (see ah_bind_thread). */
#define ah_extra(L) (*(uintptr_t *)lua_getextraspace(L))
/* the slot index fits in the extra space (it does in every stock build) */
#define AH_EXTRA_FITS (LUA_EXTRASPACE >= sizeof(uintptr_t))

#endif
