/*
** coro.c - the coroutine trampoline: create, wrap, resume and close with
** propagation, as drop-in replacements for the coroutine library.
**
** create() captures the creator's frame into the new thread's slot; from
** then on the thread carries its own context, so resume() has nothing to
** switch: with no hook enabled it is lcorolib's resume plus a few integer
** tests.  With before/after/destroy hooks enabled it emits them around
** the resume slice, in the coroutine's context.
*/
#include "coro.h"
#include "base.h"
#include "slots.h"
#include "anchors.h"
#include "hooks.h"
#include "queue.h"
#include "scope.h"

static lua_State *getco(lua_State *L) {
  lua_State *co = lua_tothread(L, 1);
  luaL_argexpected(L, co, 1, "thread"); /* lcorolib's words */
  return co;
}

/* push init's type and resource for the coroutine at thread_idx (slot
** s): its {thread = co} only for hooks that can see it, else nil (made
** when executionAsyncResource() asks, ah_push_resource_of) */
static void push_init_args(lua_State *L, ah_state *st, int s, int thread_idx) {
  luaL_checkstack(L, AH_INIT_ARGS_STACK, "async_hooks");
  lua_rawgeti(L, AH_UV_AUX, AUX_TCORO);
  if (st->init_res)
    ah_push_resource_of(L, st, s, thread_idx);
  else
    lua_pushnil(L);
}

/* register the coroutine at thread_idx, created by L, and emit its init */
static void init_coroutine(lua_State *L, ah_state *st, int thread_idx) {
  int s = ah_slot_of(L, st), ns;
  lua_Integer trigger = st->slots[s].id;
  thread_idx = lua_absindex(L, thread_idx);
  ah_frame_sync(L, st, s);
  lua_rawgeti(L, AH_UV_F, s);
  ns = ah_register(L, st, thread_idx, -1, trigger, AH_KCORO);
  lua_pop(L, 1);
  if (ah_hooks_on(st, AH_INIT)) {
    /* the stack is reserved first: nothing allocates between the decision
    ** and the dispatch (a finalizer cannot enable such a hook in between) */
    push_init_args(L, st, ns, thread_idx);
    /* an error of the dispatch (not the hook's own) is create's, the
    ** coroutine registered all the same (unreachable, destroyed when
    ** collected: its init was delivered) */
    if (ah_emit_init_v(L, st, st->slots[ns].base_id, -2, trigger, -1))
      ah_raise(L);
    lua_pop(L, 2);
  }
}

static int co_create(lua_State *L) {
  ah_state *st = ah_st(L);
  lua_State *NL;
  int s, top;
  if (ah_unlikely(lua_type(L, 1) != LUA_TFUNCTION)) /* (its error, but */
    luaL_checktype(L, 1, LUA_TFUNCTION);            /* no call to get there) */
  NL = lua_newthread(L);
  lua_pushvalue(L, 1);
  lua_xmove(L, NL, 1);
  top = lua_gettop(L);
  s = ah_slot_of(L, st);
  if (ah_likely(!st->nhooks[AH_INIT] && !st->nhooks[AH_DESTROY])) {
    int ns, framed, plain;
    lua_Integer trigger = st->slots[s].id;
    if (ah_unlikely(!st->extra)) ah_reserve_binding(L, st, top);
    /* F and TH are checked here, before any change (lua_geti raises
    ** unless F can be indexed), and used unchecked below */
    ah_frame_sync(L, st, s);
    lua_geti(L, AH_UVI_F, s); /* top + 1: the creator's frame */
    (void)AH_UV_TH;
    framed = st->slots[s].anchored & A_FRAME; /* it is not the empty one */
    /* its anchor: a plain frame in AUX_PEND (cannot fail), else a new key
    ** in T, keyed by the new thread (can fail; it runs no finalizer):
    ** first */
    plain = framed && ah_frame_plain(L, st, top + 1);
    if (framed && !plain) ah_eph_set(L, st, AH_UV_T, top, top + 1);
    /* checked after the steps that allocate: their finalizers can take the
    ** last free slot or enable a hook */
    if (ah_unlikely((st->free_low < 0 && st->free_high < 0) ||
                    st->nhooks[AH_INIT] || st->nhooks[AH_DESTROY])) {
      lua_settop(L, top);
      init_coroutine(L, st, top);
      return 1;
    }
    ns = ah_take_slot(L, st, NL, trigger);
    if (ah_likely(st->extra))
      ah_extra(NL) = (uintptr_t)ns;
    else
      ah_bind_thread_table(L, ns, top);
    lua_pushvalue(L, top);
    lua_rawseti(L, AH_UV_TH, ns);
    if (plain) {
      ah_pend_set(L, ns, top + 1);
      st->slots[ns].anchored |= A_FRAME | A_PEND;
    } else if (framed) {
      st->slots[ns].anchored |= A_FRAME | AKEY_FRAME;
    }
    lua_rawseti(L, AH_UV_F, ns);
    st->fgen++; /* frame writes are counted (see luv/'s rearm) */
    return 1;
  }
  init_coroutine(L, st, top);
  return 1;
}

/* A thread the library did not create (a coroutine.create saved before
** install(), C code's lua_newthread) gets a slot, silently, when it first
** touches the library: no event is ever emitted for it.  Resumed or closed
** by the library, it becomes a coroutine like the library's own from then
** on: its init now (its trigger the resumer's id), then before/after and
** destroy.  Allocations first (can fail: the thread stays silent).
** Returns 1 with the error pushed when the init dispatch failed (not the
** hook's own): the thread is adopted all the same (its init counts as
** delivered). */
static int adopt(lua_State *L, ah_state *st, int cs, int co_idx) {
  int s = ah_slot_of(L, st), init, err = 0;
  lua_Integer trigger = st->slots[s].id;
  if (ah_hooks_on(st, AH_DESTROY)) ah_arm_anchors(L, st); /* its token */
  /* decided once: the steps below can run finalizers, which can enable or
  ** disable hooks (ah_emit_init_v emits nothing if none is left) */
  init = ah_hooks_on(st, AH_INIT);
  if (init) {
    push_init_args(L, st, cs, co_idx);
  }
  /* (the steps above can run finalizers: cs is the thread's still, the
  ** caller holds it) */
  st->slots[cs].kind = AH_KCORO;
  st->slots[cs].base_trigger = st->slots[cs].trigger = trigger;
  if (ah_hooks_on(st, AH_DESTROY) && !st->slots[cs].has_gc) {
    st->slots[cs].has_gc = 1;
    st->slots[cs].anchored |= A_TOKPEND;
    st->slots[cs].pend_age = 0;
    st->npend++;
  }
  if (init) {
    err = ah_emit_init_v(L, st, st->slots[cs].base_id, -2, trigger, -1);
    if (err) lua_replace(L, -3); /* [type resource error] -> [error] */
    lua_pop(L, err ? 1 : 2);
  }
  return err;
}

/* slot of the coroutine at co_idx (absolute), registering and adopting a
** thread created behind the library's back (see adopt) with the
** resumer's context; -1 for a coroutine that finished and gave its slot
** back.  *err: 1 with the error of the adoption's init pushed. */
static int co_slot(lua_State *L, ah_state *st, lua_State *co, int co_idx,
                   int *err) {
  int s, cs = ah_slot_find(L, st, co, co_idx);
  *err = 0;
  if (ah_likely(cs < 0 || (cs > 0 && st->slots[cs].kind != AH_KFOREIGN)))
    return cs;
  if (cs == 0) {
    s = ah_slot_of(L, st);
    ah_frame_sync(L, st, s);
    lua_rawgeti(L, AH_UV_F, s);
    cs = ah_register(L, st, co_idx, -1, st->slots[s].id, AH_KFOREIGN);
    lua_pop(L, 1);
  }
  *err = adopt(L, st, cs, co_idx);
  return cs;
}

/* a coroutine with status LUA_OK that can start */
static int suspended(lua_State *co) {
  lua_Debug ar;
  return lua_getstack(co, 0, &ar) == 0 && lua_gettop(co) > 0;
}

/* A resume slice: the coroutine resumed and where its resumer holds it,
** its slot, and what the resume decided before it ran */
typedef struct slice {
  lua_State *co;
  int co_idx; /* 1 (resume) or AH_UV_CO (a wrap function's): absolute */
  int cs;     /* its slot; -1: none (it finished and gave it back) */
  int runs;   /* it can run: a real resume, counted as active */
  int hooks;  /* its before was emitted (slice hooks enabled, it runs) */
} slice;

/* emit `kind` for the coroutine co (asyncId id, triggerAsyncId trigger),
** which has or had slot cs, as if it ran: the resumer's ids are the
** coroutine's meanwhile, and its resource is reported as the resumer's
** (st->ov, see ah.h): nothing is written to a table */
static int emit_own(lua_State *L, ah_state *st, int kind, int cs,
                    lua_State *co, lua_Integer id, lua_Integer trigger) {
  int s, err;
  lua_Integer pid, ptrig;
  ah_ov pov = st->ov;
  if (kind == AH_AFTER) /* (before: resume's own frame has LUA_MINSTACK) */
    luaL_checkstack(L, AH_EMIT_STACK, "async_hooks dispatch"); /* first: it can fail */
  (void)AH_UV_AUX; /* the dispatch's table, checked before st->ov changes */
  s = ah_slot_of(L, st);
  pid = st->slots[s].id;
  ptrig = st->slots[s].trigger;
  st->slots[s].id = id;
  st->slots[s].trigger = trigger;
  st->ov.slot = s;
  st->ov.res = cs;
  st->ov.co = co;
  st->ov.id = id;
  err = ah_emit_id_reserved(L, st, kind, id);
  st->slots[s].id = pid; /* s is the running thread's: still its slot */
  st->slots[s].trigger = ptrig;
  st->ov = pov;
  return err;
}

/* emit before/after for the coroutine of the slice, in its context, and
** for the scopes open inside it; 1 with the first error of their
** dispatches pushed (every event is emitted all the same) */
static AH_ALWAYS_INLINE int emit_slice(lua_State *L, ah_state *st, int kind,
                                       const slice *sl) {
  int cs = sl->cs;
  /* its ids first: a scope's after hook can close co, and a coroutine
  ** created then can take its slot */
  lua_Integer id = st->slots[cs].base_id, trigger = st->slots[cs].base_trigger;
  /* open scopes are marked out at every end of a slice, with hooks or
  ** without (see ah_scopes_slice) */
  int scopes = st->slots[cs].scopes &&
               (kind == AH_AFTER || st->nhooks[AH_BEFORE] || st->nhooks[AH_AFTER]);
  int err = 0;
  if (scopes && kind == AH_AFTER) err = ah_scopes_slice(L, st, AH_AFTER, sl->co_idx);
  if (st->nhooks[kind])
    err = ah_keep_first(L, err, emit_own(L, st, kind, cs, sl->co, id, trigger));
  if (scopes && kind == AH_BEFORE)
    err = ah_keep_first(L, err, ah_scopes_slice(L, st, AH_BEFORE, sl->co_idx));
  return err;
}

/* the coroutine in slot cs is finished: destroy it once */
static void ended(ah_state *st, int cs) {
  if (st->slots[cs].destroyed) return;
  st->slots[cs].destroyed = 1;
  if (st->nhooks[AH_DESTROY]) ah_queue_destroy(st, st->slots[cs].base_id);
}

#define SLICE_HOOKS(st) \
  ((st)->nhooks[AH_BEFORE] | (st)->nhooks[AH_AFTER] | (st)->nhooks[AH_DESTROY])

/* the coroutine of a wrap function: its upvalue 1, as in lcorolib */
#define AH_UV_CO AH_UV_OWN

/* move the nres results (or the error: nres < 0) of co to L */
static int take_results(lua_State *L, lua_State *co, int status, int nres) {
  if (status == LUA_OK || status == LUA_YIELD) {
    if (ah_likely(lua_checkstack(L, nres + 1))) {
      lua_xmove(co, L, nres);
      return nres;
    }
    lua_pop(co, nres);
    lua_pushliteral(L, "too many results to resume");
    return -1;
  }
  lua_xmove(co, L, 1);
  return -1;
}

/* the rest of the slice's resume, which returned status with nres
** results: results, after, destroy.  An error of their dispatches is
** raised once all is done: it is the resumer's (its hooks run there), as
** a stack overflow, memory error or debug hook's error in the resumer's
** own code would be */
static AH_NOINLINE int resumed(lua_State *L, ah_state *st, const slice *sl,
                               int status, int nres) {
  lua_State *co = sl->co;
  int cs = sl->cs, err = 0;
  lua_Integer id;
  nres = take_results(L, co, status, nres);
  if (cs < 0) goto done;
  id = st->slots[cs].base_id;
  /* a hook enabled inside the slice gets its after (without a before);
  ** open scopes are marked out even without hooks (see emit_slice) */
  if (sl->hooks || (sl->runs && (st->nhooks[AH_AFTER] || st->nhooks[AH_BEFORE] ||
                                 st->slots[cs].scopes))) {
    err = emit_slice(L, st, AH_AFTER, sl);
    /* the after hook closed co (ended and released: the slot may be
    ** another thread's now) */
    if (st->slots[cs].L != co || st->slots[cs].base_id != id) goto done;
  }
  if (status == LUA_OK) { /* returned: nothing of it can run again */
    ended(st, cs);
    ah_release(L, st, cs);
  } else if (status != LUA_YIELD && lua_status(co) != LUA_OK &&
             lua_status(co) != LUA_YIELD) {
    /* raised (resuming a dead or running coroutine fails without
    ** changing its status); its slot stays for coroutine.close */
    ended(st, cs);
  }
done:
  if (ah_flush_due(st)) err = ah_keep_first(L, err, ah_flush_status(L, st));
  if (ah_unlikely(err)) {
    /* a wrapped coroutine that raised is closed (its to-be-closed
    ** variables), as lcorolib's wrap does, before the error is raised */
    if (sl->co_idx == AH_UV_CO && status != LUA_OK && status != LUA_YIELD &&
        lua_status(co) != LUA_OK && lua_status(co) != LUA_YIELD)
      ah_closethread(co, L);
    ah_raise(L);
  }
  return nres;
}

/* The before half of a resume failed (the error on top, the arguments
** below it): the coroutine does not run, its after half is emitted all
** the same (events stay balanced), then the error is resume's.  A C stack
** overflow is returned (resume returns false and it, as Lua's resume does
** at that depth); anything else is raised, as in resumed().  closed: the
** before hook closed co (asyncId id, triggerAsyncId trigger). */
static AH_COLD int not_resumed(lua_State *L, ah_state *st, const slice *sl,
                               int closed, lua_Integer id, lua_Integer trigger) {
  if (closed) {
    if (st->nhooks[AH_AFTER])
      ah_keep_first(L, 1, emit_own(L, st, AH_AFTER, sl->cs, sl->co, id, trigger));
  } else {
    ah_keep_first(L, 1, emit_slice(L, st, AH_AFTER, sl));
  }
  if (ah_flush_due(st)) ah_keep_first(L, 1, ah_flush_status(L, st));
  if (ah_cstack_error(L, -1)) return -1;
  return ah_raise(L);
}

/* lcorolib's auxresume, plus hooks, for every case */
static AH_NOINLINE int auxresume_full(lua_State *L, ah_state *st,
                                      lua_State *co, int co_idx, int narg) {
  slice sl;
  int status, nres, err, cs;
  if (ah_unlikely(!lua_checkstack(co, narg))) {
    lua_pushliteral(L, "too many arguments to resume");
    return -1;
  }
  ah_rearm(L, st); /* a sentinel whose re-arming failed: destroys wait on it */
  cs = co_slot(L, st, co, co_idx, &err); /* co_idx: 1 or an upvalue: absolute */
  if (ah_unlikely(err)) { /* its adoption's init failed: it does not run
    ** (a C stack overflow is returned, as at a before: see not_resumed) */
    if (ah_cstack_error(L, -1)) return -1;
    return ah_raise(L);
  }
  sl.co = co;
  sl.co_idx = co_idx;
  sl.cs = cs;
  /* a coroutine that cannot run makes lua_resume build an error message,
  ** which can raise (out of memory): count only real resumes as active */
  status = lua_status(co);
  sl.runs = status == LUA_YIELD || (status == LUA_OK && suspended(co));
  sl.hooks = SLICE_HOOKS(st) && cs >= 0 && sl.runs;
  if (sl.hooks) {
    lua_Integer id = st->slots[cs].base_id, trigger = st->slots[cs].base_trigger;
    err = emit_slice(L, st, AH_BEFORE, &sl);
    int closed = st->slots[cs].L != co || st->slots[cs].base_id != id;
    if (ah_unlikely(err)) return not_resumed(L, st, &sl, closed, id, trigger);
    if (ah_unlikely(closed)) {
      /* the before hook closed co (its slot may be another thread's now):
      ** its after, in its context (its ids; its resource, anchored by its
      ** thread when it had one), nothing from the slot */
      lua_xmove(L, co, narg);
      status = lua_resume(co, L, narg, &nres); /* cannot resume dead */
      nres = take_results(L, co, status, nres);
      err = st->nhooks[AH_AFTER] && emit_own(L, st, AH_AFTER, cs, co, id, trigger);
      if (ah_flush_due(st)) err = ah_keep_first(L, err, ah_flush_status(L, st));
      if (ah_unlikely(err)) ah_raise(L);
      return nres;
    }
  }
  lua_xmove(L, co, narg);
  st->active += sl.runs;
  status = lua_resume(co, L, narg, &nres);
  st->active -= sl.runs;
  return resumed(L, st, &sl, status, nres);
}

/* resumed() for the fast path's slice: it ran, no before was emitted (a
** cold function of its own: the fast path keeps no slice on its stack) */
static AH_COLD int resumed_ran(lua_State *L, ah_state *st, lua_State *co,
                                   int co_idx, int cs, int status, int nres) {
  slice sl;
  sl.co = co;
  sl.co_idx = co_idx;
  sl.cs = cs;
  sl.runs = 1;
  sl.hooks = 0;
  return resumed(L, st, &sl, status, nres);
}

/* The fast path: a coroutine the library knows, that can run, no
** before/after/destroy hook: lcorolib's code plus a few integer tests. */
static AH_ALWAYS_INLINE int auxresume(lua_State *L, ah_state *st, lua_State *co,
                               int co_idx, int narg) {
  uintptr_t cs = ah_extra(co);
  int status, nres;
  if (ah_likely(!SLICE_HOOKS(st) && cs < (uintptr_t)st->cap &&
                st->slots[cs].L == co && st->slots[cs].kind == AH_KCORO)) {
    status = lua_status(co);
    if (ah_likely((status == LUA_YIELD || (status == LUA_OK && suspended(co))) &&
                  lua_checkstack(co, narg))) {
      lua_xmove(L, co, narg);
      st->active++;
      status = lua_resume(co, L, narg, &nres);
      st->active--;
      if (ah_likely(!SLICE_HOOKS(st) && !st->dq_n &&
                    lua_checkstack(L, nres + 1))) {
        if (status == LUA_YIELD && ah_likely(!st->slots[cs].scopes)) {
          lua_xmove(co, L, nres);
          return nres;
        }
        if (status == LUA_OK) {
          lua_xmove(co, L, nres);
          st->slots[cs].destroyed = 1;
          ah_release(L, st, (int)cs);
          return nres;
        }
      }
      return resumed_ran(L, st, co, co_idx, (int)cs, status, nres);
    }
  }
  return auxresume_full(L, st, co, co_idx, narg);
}

static int co_resume(lua_State *L) {
  ah_state *st = ah_st(L);
  lua_State *co = getco(L);
  int r = auxresume(L, st, co, 1, lua_gettop(L) - 1);
  if (r < 0) {
    lua_pushboolean(L, 0);
    lua_insert(L, -2);
    return 2;
  }
  lua_pushboolean(L, 1);
  lua_insert(L, -(r + 1));
  return r + 1;
}

static int co_auxwrap(lua_State *L) {
  ah_state *st = ah_st(L);
  lua_State *co = lua_tothread(L, AH_UV_CO);
  int r;
  if (ah_unlikely(co == NULL))
    return luaL_error(L, "cannot resume a %s (upvalue 1 of a coroutine.wrap "
                         "function)", luaL_typename(L, AH_UV_CO));
  r = auxresume(L, st, co, AH_UV_CO, lua_gettop(L));
  if (r < 0) {
    int stat = lua_status(co);
    if (stat != LUA_OK && stat != LUA_YIELD) { /* error in the coroutine */
      stat = ah_closethread(co, L);            /* close its tbc variables */
      lua_xmove(co, L, 1);
    }
    if (stat != LUA_ERRMEM && lua_type(L, -1) == LUA_TSTRING) {
      int again = ah_reraised(L, st, -1); /* a dispatch's, raised again */
      luaL_where(L, 1);
      lua_insert(L, -2);
      lua_concat(L, 2);
      if (ah_unlikely(again)) return ah_raise(L);
    }
    return lua_error(L);
  }
  return r;
}

/* a closure over the new coroutine (its upvalue 1, as lcorolib's) and
** the shared upvalues */
static int co_wrap(lua_State *L) {
  int i;
  luaL_checktype(L, 1, LUA_TFUNCTION); /* first: "got no value" stays */
  lua_settop(L, 1); /* as lcorolib's wrap: arguments after f are ignored */
  co_create(L); /* 2 */
  for (i = 2; i <= AH_NUP; i++) lua_pushvalue(L, lua_upvalueindex(i));
  lua_pushcclosure(L, co_auxwrap, AH_NUP);
  return 1;
}

enum { COS_RUN, COS_DEAD, COS_YIELD, COS_NORM };
static const char *const statname[] = {"running", "dead", "suspended",
                                       "normal"};

static int auxstatus(lua_State *L, lua_State *co) {
  lua_Debug ar;
  if (L == co) return COS_RUN;
  switch (lua_status(co)) {
    case LUA_YIELD: return COS_YIELD;
    case LUA_OK:
      if (lua_getstack(co, 0, &ar)) return COS_NORM;
      return lua_gettop(co) == 0 ? COS_DEAD : COS_YIELD;
    default: return COS_DEAD;
  }
}

static int co_close(lua_State *L) {
  ah_state *st = ah_st(L);
  lua_State *co = getco(L);
  int status = auxstatus(L, co), cs, err;
  if (status != COS_DEAD && status != COS_YIELD)
    return luaL_error(L, "cannot close a %s coroutine", statname[status]);
  cs = co_slot(L, st, co, 1, &err); /* err: raised once it is closed */
  st->active++;
  status = ah_closethread(co, L);
  st->active--;
  if (cs >= 0) {
    ended(st, cs);
    ah_release(L, st, cs);
  }
  if (ah_unlikely(err)) {
    if (ah_flush_due(st)) ah_keep_first(L, 1, ah_flush_status(L, st));
    return ah_raise(L);
  }
  ah_flush_maybe(L, st);
  if (status == LUA_OK) {
    lua_pushboolean(L, 1);
    return 1;
  }
  lua_pushboolean(L, 0);
  lua_xmove(co, L, 1);
  return 2;
}

static const luaL_Reg coro_funcs[] = {
  {"create", co_create},
  {"wrap", co_wrap},
  {"resume", co_resume},
  {"close", co_close},
  {NULL, NULL}
};

/* module table on top: adds module.coro = {create, wrap, resume, close};
** init's type of a coroutine, made once (not re-interned per init) */
void ah_open_coro(lua_State *L) {
  lua_pushliteral(L, "coroutine");
  lua_rawseti(L, AH_UV_AUX, AUX_TCORO);
  lua_createtable(L, 0, 4);
  ah_add_funcs(L, coro_funcs);
  lua_setfield(L, -2, "coro");
}
