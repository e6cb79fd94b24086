/*
** hooks.c - createHook's machinery: the enabled hook set, per-kind counters,
** dispatch with deferred enable/disable, the delivery of queued destroys.
**
** The set of enabled hooks is an ordered array (AUX_ORDER).  Dispatch reads
** per-kind arrays of functions (AUX_LISTS) that are rebuilt, never edited,
** when the set changes.  enable/disable build the new arrays at once (into
** AUX_NEXT; that allocates, and raising there is fine); outside a dispatch
** they become current at once, inside one when the outermost dispatch ends,
** by a swap that cannot fail.  A dispatch that is running keeps iterating
** the arrays it started with.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hooks.h"
#include "base.h"
#include "slots.h"

static const char *const kind_names[AH_NKINDS + 1] = {
  NULL, "init", "before", "after", "destroy"
};

/* --------------------------------------------------------------------- */
/* the enabled set                                                         */

/* an init hook at the top (popped) can see its 4th argument, the
** resource: a C function, or a Lua function with 4 parameters or `...`.
** The others cannot (a Lua function has no access to arguments beyond its
** parameters unless it is vararg), so for them no resource is made just to
** be passed: one is made later if executionAsyncResource() asks for it. */
static int sees_resource(lua_State *L) {
  lua_Debug ar;
  lua_getinfo(L, ">u", &ar); /* pops; allocates nothing */
  return ar.isvararg || ar.nparams >= 4;
}

/* prepare(aux, st): build the per-kind lists of the enabled set into
** aux[AUX_NEXT] and their sizes into st->next_n (and the number of init
** hooks that see the resource into st->next_init_res).  Allocates: runs
** protected, before anything changes (see commit). */
static int l_prepare(lua_State *L) {
  ah_state *st = (ah_state *)lua_touserdata(L, 2);
  int k, i, n, counts[AH_NKINDS + 1], init_res = 0;
  /* (a light C function: the debug library can call it with anything) */
  if (lua_type(L, 1) != LUA_TTABLE || st == NULL ||
      lua_rawlen(L, 2) != sizeof(ah_state) || st->self != st ||
      lua_rawgeti(L, 1, AUX_ORDER) != LUA_TTABLE) /* 3 */
    return luaL_error(L, "async_hooks: internal state damaged (hook list)");
  n = (int)lua_rawlen(L, 3);
  lua_createtable(L, 2 * AH_NKINDS, 0); /* 4 */
  for (k = 1; k <= AH_NKINDS; k++) {
    int c = 0;
    lua_createtable(L, n, 0);
    for (i = 1; i <= n; i++) {
      lua_rawgeti(L, 3, i);
      if (lua_getfield(L, -1, kind_names[k]) == LUA_TFUNCTION) {
        if (k == AH_INIT) {
          lua_pushvalue(L, -1);
          init_res += sees_resource(L);
        }
        lua_rawseti(L, -3, ++c);
      } else
        lua_pop(L, 1);
      lua_pop(L, 1);
    }
    if (c == 1) lua_rawgeti(L, -1, 1); else lua_pushboolean(L, 0);
    lua_rawseti(L, 4, AH_NKINDS + k); /* the only hook of the kind */
    lua_rawseti(L, 4, k);
    counts[k] = c;
  }
  lua_rawseti(L, 1, AUX_NEXT);
  /* the counts last, with the lists: a failure above changes neither */
  for (k = 1; k <= AH_NKINDS; k++) st->next_n[k] = counts[k];
  st->next_init_res = init_res;
  return 0;
}

/* Make the prepared lists current.  Cannot fail (a raw set of an integer
** key that exists in aux's array part, and integer copies), so the end of
** a dispatch can do it inside sections that must not fail; the luv
** integration's callback (Lua code) is only noted here and called at the
** next flush point (ah_flush) or enable/disable. */
static void commit(lua_State *L, ah_state *st) {
  int k, had = st->nhooks[AH_DESTROY] != 0;
  /* (aux or its lists damaged by the debug library: the counts alone) */
  int aux = lua_type(L, AH_UVI_AUX) == LUA_TTABLE;
  int ok = aux && lua_rawgeti(L, AH_UVI_AUX, AUX_NEXT) == LUA_TTABLE;
  if (ok) {
    lua_pushvalue(L, -1);
    lua_rawseti(L, AH_UVI_AUX, AUX_LISTS);
  }
  for (k = 1; k <= AH_NKINDS; k++) {
    st->nhooks[k] = st->next_n[k];
    if (!ok) continue;
    lua_rawgeti(L, -1, AH_NKINDS + k); /* in AUX's array part: no allocation */
    lua_rawseti(L, AH_UVI_AUX, AUX_HOOK1 + k - 1);
  }
  if (aux) lua_pop(L, 1);
  st->init_res = st->next_init_res;
  st->dirty = 0;
  st->watched = st->res_on || st->nhooks[AH_INIT] || st->nhooks[AH_BEFORE] ||
                st->nhooks[AH_AFTER] || st->nhooks[AH_DESTROY];
  if (had != (st->nhooks[AH_DESTROY] != 0)) st->notify_pending = 1;
}

/* tell whoever registered with on_destroy_hooks whether destroy hooks
** exist; Lua code: only where raising is fine */
void ah_notify_destroy_hooks(lua_State *L, ah_state *st) {
  st->notify_pending = 0;
  if (lua_rawgeti(L, AH_UV_AUX, AUX_ONDESTROY) == LUA_TFUNCTION) {
    lua_pushboolean(L, st->nhooks[AH_DESTROY] != 0);
    lua_call(L, 1, 0);
  } else {
    lua_pop(L, 1);
  }
}

/* the enabled set changed: prepare the lists (or raise, with nothing
** changed: 0 is returned after the error object was pushed; callers made
** room for 3 values on the stack), then commit
** now or, inside a dispatch, when the outermost dispatch ends */
static int changed(lua_State *L, ah_state *st) {
  lua_pushcfunction(L, l_prepare);
  lua_pushvalue(L, AH_UV_AUX);
  lua_pushvalue(L, AH_UV_STATE); /* (st, checked by the caller) */
  if (lua_pcall(L, 2, 0, 0) != LUA_OK) return 0;
  if (st->dispatching) {
    st->dirty = 1;
    return 1;
  }
  commit(L, st);
  if (st->notify_pending) ah_notify_destroy_hooks(L, st);
  return 1;
}

/* position of the hook at idx in AUX_ORDER (pushed on top), or 0 */
static int find_hook(lua_State *L, int idx) {
  int i, n;
  ah_auxt(L, AUX_ORDER);
  n = (int)lua_rawlen(L, -1);
  for (i = 1; i <= n; i++) {
    lua_rawgeti(L, -1, i);
    if (lua_rawequal(L, -1, idx)) {
      lua_pop(L, 1);
      return i;
    }
    lua_pop(L, 1);
  }
  return 0;
}

/* enable/disable: the order list and a hook of it (find_hook), changed()'s
** 3 values, an error */
#define HOOKSET_STACK 8

static int l_hook_enable(lua_State *L) {
  ah_state *st = ah_st(L);
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  luaL_checkstack(L, HOOKSET_STACK, "async_hooks");
  if (!find_hook(L, 1)) {
    lua_Integer n = (lua_Integer)lua_rawlen(L, -1) + 1;
    lua_pushvalue(L, 1);
    lua_rawseti(L, -2, n);
    if (!changed(L, st)) { /* out of memory: take it back */
      lua_pushnil(L);
      lua_rawseti(L, 2, n);
      return lua_error(L);
    }
  }
  lua_settop(L, 1);
  return 1;
}

static int l_hook_disable(lua_State *L) {
  ah_state *st = ah_st(L);
  int i, n;
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  luaL_checkstack(L, HOOKSET_STACK, "async_hooks");
  if ((i = find_hook(L, 1)) != 0) {
    int at = i;
    n = (int)lua_rawlen(L, -1);
    for (; i < n; i++) {
      lua_rawgeti(L, -1, i + 1);
      lua_rawseti(L, -2, i);
    }
    lua_pushnil(L);
    lua_rawseti(L, -2, n);
    if (!changed(L, st)) { /* out of memory: put it back (no new keys) */
      for (i = n; i > at; i--) {
        lua_rawgeti(L, 2, i - 1);
        lua_rawseti(L, 2, i);
      }
      lua_pushvalue(L, 1);
      lua_rawseti(L, 2, at);
      lua_pushvalue(L, 3);
      return lua_error(L);
    }
  }
  lua_settop(L, 1);
  return 1;
}

/* on_destroy_hooks(f|nil) -> previous: f(true) when destroy hooks appear,
** f(false) when the last one goes (called where raising is fine: never at
** the end of a dispatch) */
static int l_on_destroy_hooks(lua_State *L) {
  if (!lua_isnil(L, 1)) luaL_checktype(L, 1, LUA_TFUNCTION);
  lua_settop(L, 1);
  lua_rawgeti(L, AH_UV_AUX, AUX_ONDESTROY);
  lua_pushvalue(L, 1);
  lua_rawseti(L, AH_UV_AUX, AUX_ONDESTROY);
  return 1;
}

static int l_hook_counts(lua_State *L) {
  ah_state *st = ah_st(L);
  int k;
  for (k = 1; k <= AH_NKINDS; k++) lua_pushinteger(L, st->nhooks[k]);
  return AH_NKINDS;
}

/* --------------------------------------------------------------------- */
/* dispatch                                                                */

/* Light registry keys of this file: the aux table (the message handler is
** a light C function, without upvalues: it finds the state there, on the
** error path only), and the error an operation called by a hook raised
** again (ah_raise; false when none). */
static char aux_key, reraise_key;

static int run_hooks(lua_State *L);

/* The message as Lua raises it for a limit, not for a program's error:
** "stack overflow" (a Lua stack that cannot grow), "C stack overflow",
** "stack overflow (...)" (luaL_checkstack), "not enough memory" and "error
** in error handling" (statuses LUA_ERRMEM and LUA_ERRERR, as strings once
** raised again), each maybe after positions ("chunk:line: ", added by Lua
** or by coroutine.wrap).  cstack: "C stack overflow" only. */
static int limit_message(const char *s, size_t n, int cstack) {
  static const char *const exact[] = {
    "C stack overflow", "stack overflow", "not enough memory",
    "error in error handling", NULL
  };
  size_t p = 0;
  for (;;) {
    const char *t = s + p;
    size_t m = n - p;
    int i;
    for (i = 0; exact[i] && (!cstack || i == 0); i++)
      if (m == strlen(exact[i]) && memcmp(t, exact[i], m) == 0) return 1;
    if (!cstack && m > 16 && memcmp(t, "stack overflow (", 16) == 0 &&
        s[n - 1] == ')')
      return 1;
    t = (const char *)memchr(t, ':', m);
    while (t && (size_t)(t - s) + 1 < n && t[1] != ' ')
      t = (const char *)memchr(t + 1, ':', n - (size_t)(t - s) - 1);
    if (!t || (size_t)(t - s) + 1 >= n) return 0;
    p = (size_t)(t - s) + 2; /* past the next ": " */
  }
}

static int limit_error(lua_State *L, int idx, int cstack) {
  size_t n;
  const char *s;
  if (lua_type(L, idx) != LUA_TSTRING) return 0;
  s = lua_tolstring(L, idx, &n);
  return limit_message(s, n, cstack);
}

/* the error at idx is Lua's "C stack overflow" (coro.c: resume reports it
** as lua_resume does at the limit) */
int ah_cstack_error(lua_State *L, int idx) {
  return limit_error(L, idx, 1);
}

/* a C function of this library: one of its upvalues is the state */
static int library_function(lua_State *L, ah_state *st, int idx) {
  int i;
  idx = lua_absindex(L, idx);
  for (i = 1; lua_getupvalue(L, idx, i) != NULL; i++) {
    int is = lua_touserdata(L, -1) == st; /* (its AH_UV_STATE) */
    lua_pop(L, 1);
    if (is) return 1;
  }
  return 0;
}

/* The error being handled was raised while a debug hook ran: a function
** between the raise and the hook function that the dispatch called was
** called by a debug hook (namewhat "hook").  The walk ends at the hook
** function the dispatch called (or run_hooks), or, past a tail call (the
** hook's own frame may be gone), at a C function of this library. */
static int in_debug_hook(lua_State *L, ah_state *st, int aux, int kind) {
  lua_Debug ar;
  int level, tail = 0, single = st->nhooks[kind] == 1;
  const void *fn = NULL;
  if (single) {
    lua_rawgeti(L, aux, AUX_HOOK1 + kind - 1);
    fn = lua_topointer(L, -1);
    lua_pop(L, 1);
  }
  for (level = 1; lua_getstack(L, level, &ar); level++) {
    int stop;
    lua_getinfo(L, "ntf", &ar);
    if (ar.namewhat && strcmp(ar.namewhat, "hook") == 0) {
      lua_pop(L, 1);
      return 1;
    }
    stop = single ? lua_topointer(L, -1) == fn
                  : lua_tocfunction(L, -1) == run_hooks;
    if (!stop && tail && lua_iscfunction(L, -1))
      stop = library_function(L, st, -1);
    tail = ar.istailcall;
    lua_pop(L, 1);
    if (stop) return 0;
  }
  return 0;
}

/* The message handler of every dispatch of kind, where the error was raised
** (the stack is still there).  An error that is not the hook's own is
** returned unchanged: a stack overflow or memory error (limit_message), an
** error raised while a debug hook runs (in_debug_hook), or one that an
** operation called by the hook raised again (ah_raise).  Anything else was
** raised by the hook's own code: the error and a traceback go to stderr,
** and the process exits with status 1.  Raises nothing (an error here
** would be handled by this handler again). */
static int hook_msgh(lua_State *L, int kind) {
  ah_state *st;
  const char *msg;
  if (limit_error(L, 1, 0)) return 1;
  lua_settop(L, 1);
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &aux_key) != LUA_TTABLE) return 1;
  lua_rawgeti(L, 2, AUX_STATE);
  st = (ah_state *)lua_touserdata(L, -1);
  lua_pop(L, 1);
  if (st == NULL) return 1;
  if (st->reraised) {
    int again;
    lua_rawgetp(L, LUA_REGISTRYINDEX, &reraise_key);
    again = lua_rawequal(L, 1, -1);
    lua_pop(L, 1);
    if (again) {
      lua_settop(L, 1);
      return 1;
    }
  }
  if (in_debug_hook(L, st, 2, kind)) {
    lua_settop(L, 1);
    return 1;
  }
  msg = lua_tostring(L, 1);
  if (msg == NULL) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
      msg = lua_tostring(L, -1);
    else
      msg = lua_pushfstring(L, "(error object is a %s value)",
                            luaL_typename(L, 1));
  }
  luaL_traceback(L, L, msg, 1);
  fprintf(stderr, "async_hooks: error in %s hook (fatal): %s\n",
          kind_names[kind], lua_tostring(L, -1));
  fflush(stderr);
  exit(1);
  return 0;
}

/* one handler per kind: the dispatch pushes the one of its kind (no state
** to keep per dispatch) */
static int msgh_init(lua_State *L) { return hook_msgh(L, AH_INIT); }
static int msgh_before(lua_State *L) { return hook_msgh(L, AH_BEFORE); }
static int msgh_after(lua_State *L) { return hook_msgh(L, AH_AFTER); }
static int msgh_destroy(lua_State *L) { return hook_msgh(L, AH_DESTROY); }
static const lua_CFunction msghs[AH_NKINDS + 1] = {
  NULL, msgh_init, msgh_before, msgh_after, msgh_destroy
};

/* run_hooks(st, handler, list, args...): call every function of list with
** args, each in a protected call of its own with the dispatch's handler (a
** hook's own error ends the process there), so that an error of one hook
** keeps none of the others from the event.  The first error is raised
** again at the end, passed through by the dispatch's handler
** (st->reraised).  Only for a kind with several hooks: one is called by
** the dispatch itself. */
static int run_hooks(lua_State *L) {
  ah_state *st = (ah_state *)lua_touserdata(L, 1);
  int nargs = lua_gettop(L) - 3, n = (int)lua_rawlen(L, 3), i, j, err = 0;
  luaL_checkstack(L, nargs + 4, "async_hooks dispatch");
  for (i = 1; i <= n; i++) {
    if (lua_rawgeti(L, 3, i) != LUA_TFUNCTION) { /* (damaged: see dispatch) */
      lua_pop(L, 1);
      continue;
    }
    for (j = 4; j <= nargs + 3; j++) lua_pushvalue(L, j);
    if (lua_pcall(L, nargs, 0, 2) != LUA_OK) {
      if (err) lua_pop(L, 1); /* the first stays, above the handler */
      err = 1;
    }
  }
  if (!err) return 0;
  lua_pushvalue(L, -1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &reraise_key); /* the key exists */
  st->reraised = 1;
  st->dirty = 1; /* (cleared when the outermost dispatch ends) */
  return lua_error(L);
}

/* the outermost dispatch ended and something was left for then: the hook
** lists changed meanwhile (a swap that cannot fail), an error raised again
** for a dispatch is no longer needed */
static void outermost_end(lua_State *L, ah_state *st) {
  commit(L, st);
  if (st->reraised) {
    st->reraised = 0;
    lua_pushboolean(L, 0);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &reraise_key); /* the key exists */
  }
}

/* Dispatch the hooks of `kind` in one protected call: the hook itself when
** the list has one function, the common case, else run_hooks and the list;
** the arguments are id and, for init (type_idx != 0), the type at
** type_idx, the trigger and the resource at res_idx.  Returns 0, or 1 with
** the error pushed (see hooks.h): the event reached every hook all the
** same.  A hook's own error ends the process (hook_msgh).  Allocates
** nothing and raises nothing once the caller made room for AH_EMIT_STACK
** values (AH_EMIT_INIT_STACK for init; the end of the dispatch only swaps
** prepared lists in): callers
** dispatch inside sections that must not fail.  A dispatch keeps the list
** it started with. */
static AH_ALWAYS_INLINE int dispatch(lua_State *L, ah_state *st, int kind,
                                     lua_Integer id, int type_idx,
                                     lua_Integer trigger, int res_idx) {
  int base = lua_gettop(L), status, nargs = 1;
  lua_pushcfunction(L, msghs[kind]); /* base + 1 */
  /* The debug library can put anything in the aux table or take it away:
  ** what is not a hook function or a list runs nothing (raising here is
  ** no option: callers dispatch inside sections that must not fail) */
  if (ah_unlikely(lua_type(L, AH_UVI_AUX) != LUA_TTABLE)) {
    lua_settop(L, base);
    return 0;
  }
  if (ah_likely(st->nhooks[kind] == 1)) {
    if (ah_unlikely(lua_rawgeti(L, AH_UVI_AUX, AUX_HOOK1 + kind - 1) != LUA_TFUNCTION)) {
      lua_settop(L, base);
      return 0;
    }
  } else {
    lua_pushcfunction(L, run_hooks);
    lua_pushlightuserdata(L, st);
    lua_pushcfunction(L, msghs[kind]);
    if (ah_unlikely(lua_rawgeti(L, AH_UVI_AUX, AUX_LISTS) != LUA_TTABLE ||
                    lua_rawgeti(L, -1, kind) != LUA_TTABLE)) {
      lua_settop(L, base);
      return 0;
    }
    lua_replace(L, -2);
    nargs = 4;
  }
  lua_pushinteger(L, id);
  if (type_idx) {
    lua_pushvalue(L, type_idx);
    lua_pushinteger(L, trigger);
    lua_pushvalue(L, res_idx);
    nargs += 3;
  }
  st->dispatching++;
  status = lua_pcall(L, nargs, 0, base + 1);
  if (ah_likely(status == LUA_OK))
    lua_settop(L, base);
  else
    lua_remove(L, base + 1); /* the handler: [error] */
  if (--st->dispatching == 0 && st->dirty) outermost_end(L, st);
  return status != LUA_OK;
}

/* Raise the error on top that a dispatch returned, once the operation is
** done.  Inside a hook, the dispatch that called it sees it as what it is
** (hook_msgh: not the hook's own). */
int ah_raise(lua_State *L) {
  ah_state *st = ah_st(L);
  if (st->dispatching) {
    lua_pushvalue(L, -1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &reraise_key); /* the key exists */
    st->reraised = 1;
    st->dirty = 1; /* cleared when the outermost dispatch ends */
  }
  return lua_error(L);
}

/* the value at idx is the error that ah_raise raised last inside a
** dispatch (wrap positions it again: see coro.c) */
int ah_reraised(lua_State *L, ah_state *st, int idx) {
  int again;
  if (!st->reraised) return 0;
  idx = lua_absindex(L, idx);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &reraise_key);
  again = lua_rawequal(L, idx, -1);
  lua_pop(L, 1);
  return again;
}

/* the same, for a caller that made room for AH_EMIT_STACK values and
** checked that hooks of the kind exist */
int ah_emit_id_reserved(lua_State *L, ah_state *st, int kind,
                        lua_Integer id) {
  return dispatch(L, st, kind, id, 0, 0, 0);
}

int ah_emit_id(lua_State *L, ah_state *st, int kind, lua_Integer id) {
  if (!st->nhooks[kind]) return 0;
  luaL_checkstack(L, AH_EMIT_STACK, "async_hooks dispatch");
  return dispatch(L, st, kind, id, 0, 0, 0);
}

/* init with the type as a Lua string at type_idx (no re-interning) */
int ah_emit_init_v(lua_State *L, ah_state *st, lua_Integer id, int type_idx,
                   lua_Integer trigger, int res_idx) {
  if (!st->nhooks[AH_INIT]) return 0;
  res_idx = lua_absindex(L, res_idx);
  type_idx = lua_absindex(L, type_idx);
  luaL_checkstack(L, AH_EMIT_INIT_STACK, "async_hooks dispatch");
  return dispatch(L, st, AH_INIT, id, type_idx, trigger, res_idx);
}

int ah_emit_init(lua_State *L, ah_state *st, lua_Integer id, const char *type,
                 lua_Integer trigger, int res_idx) {
  if (!st->nhooks[AH_INIT]) return 0;
  res_idx = lua_absindex(L, res_idx);
  luaL_checkstack(L, AH_EMIT_INIT_STACK, "async_hooks dispatch");
  lua_pushstring(L, type); /* can fail: before the dispatch starts */
  if (ah_emit_init_v(L, st, id, -1, trigger, res_idx)) {
    lua_remove(L, -2);
    return 1;
  }
  lua_pop(L, 1);
  return 0;
}

/* --------------------------------------------------------------------- */
/* destroy queue                                                           */

/* ah_queue_destroy is queue.c's (slots.c queues from a finalizer) */

/* deliver queued destroys, in queue order, including those queued while
** delivering; callers make sure no callback, resume or dispatch is active.
** Returns 0, or 1 with the first error of their dispatches pushed (all are
** delivered all the same).  Raises before anything changes (the stack,
** the luv integration's Lua step). */
int ah_flush_status(lua_State *L, ah_state *st) {
  size_t i;
  int err = 0;
  /* never inside a finalizer (a user's __gc that ends a resource, runs a
  ** scope or a coroutine): the next flush point outside delivers them */
  if (ah_unlikely(ah_in_finalizer(L))) return 0;
  luaL_checkstack(L, AH_FLUSH_STACK, "async_hooks"); /* the only steps that
                                                     ** can fail */
  if (st->notify_pending) ah_notify_destroy_hooks(L, st);
  st->active++; /* no nested flush from inside a destroy hook */
  for (i = 0; i < st->dq_n; i++) {
    if (!st->nhooks[AH_DESTROY]) break;
    /* room: above (one value more for an error) */
    if (ah_unlikely(dispatch(L, st, AH_DESTROY, st->dq[i], 0, 0, 0)))
      err = ah_keep_first(L, err, 1);
  }
  st->dq_n = 0;
  st->active--;
  return err;
}

/* the same, raising the error once all are delivered */
void ah_flush(lua_State *L, ah_state *st) {
  if (ah_flush_status(L, st)) ah_raise(L);
}

static int l_flush(lua_State *L) {
  ah_state *st = ah_st(L);
  ah_rearm(L, st);
  ah_flush_maybe(L, st);
  return 0;
}

static const luaL_Reg hook_funcs[] = {
  {"hook_enable", l_hook_enable},
  {"hook_disable", l_hook_disable},
  {"hook_counts", l_hook_counts},
  {"on_destroy_hooks", l_on_destroy_hooks},
  {"flush", l_flush},
  {NULL, NULL}
};

/* module table on top: the hook lists, the hook functions */
void ah_open_hooks(lua_State *L) {
  int i;
  lua_newtable(L);
  lua_rawseti(L, AH_UV_AUX, AUX_ORDER);
  lua_createtable(L, 2 * AH_NKINDS, 0);
  for (i = 1; i <= AH_NKINDS; i++) {
    lua_newtable(L);
    lua_rawseti(L, -2, i);
    lua_pushboolean(L, 0);
    lua_rawseti(L, -2, AH_NKINDS + i);
  }
  lua_pushvalue(L, -1);
  lua_rawseti(L, AH_UV_AUX, AUX_NEXT);
  lua_rawseti(L, AH_UV_AUX, AUX_LISTS);
  for (i = 1; i <= AH_NKINDS; i++) {
    lua_pushboolean(L, 0);
    lua_rawseti(L, AH_UV_AUX, AUX_HOOK1 + i - 1);
  }
  /* the registry keys of the dispatch, made now: setting them later
  ** allocates nothing */
  lua_pushvalue(L, AH_UV_AUX);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &aux_key);
  lua_pushboolean(L, 0);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &reraise_key);
  ah_add_funcs(L, hook_funcs);
}
