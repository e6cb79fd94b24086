/*
** scope.c - the scope trampoline behind AsyncResource:runInAsyncScope and
** every bound function.
**
** enter_scope(id, trigger, resource, frame) switches the current thread's
** context and returns a guard whose __close emits `after` and restores the
** previous context.  Lua code holds it in a to-be-closed variable, so the
** restore happens on return, on error (the error object and traceback are
** untouched, no pcall involved) and, inside a coroutine, when the coroutine
** is closed; the scope spans yields because it lives in the coroutine's own
** stack.  Scopes entered from Lua nest without C-stack limits.
**
** Inside a coroutine the open guards form a chain (AUX_TG[thread], then
** guard user value 3), so that when hooks are enabled a yield can emit
** `after` for every open scope (innermost first) and the next resume
** `before` again (outermost first): before/after stay properly nested even
** though a scope spans the yield.
*/
#include "scope.h"
#include "base.h"
#include "slots.h"
#include "anchors.h"
#include "hooks.h"
#include "resource.h"

typedef struct ah_guard {
  const ah_state *st; /* first: what marks a guard of this state (the
                      ** debug library can give its metatable to others) */
  lua_Integer id, trigger, prev_id, prev_trigger;
  int on_main;
  int closed;
  int out; /* its `after` was emitted when the coroutine yielded/failed */
  int ov;  /* entered inside a coroutine's event emitted from this thread
           ** (st->ov.slot, suspended while the scope is open), or 0 */
} ah_guard;

/* guard user values */
enum { G_PREV_RES = 1, G_PREV_FRAME, G_PREV_GUARD, G_RES, G_NUV = G_RES };

static int close_guard(lua_State *L, ah_state *st, ah_guard *g, int gidx);

/* enter_scope's pushes: the guard and its user values, the anchors' keys,
** its before's dispatch, an error */
#define ENTER_STACK (AH_EMIT_STACK + 12)

static int l_enter_scope(lua_State *L) {
  ah_state *st = ah_st(L);
  lua_Integer id = luaL_checkinteger(L, 1);
  lua_Integer trigger = luaL_checkinteger(L, 2);
  ah_guard *g;
  int s;
  luaL_checkany(L, 3);
  luaL_checktype(L, 4, LUA_TTABLE);
  lua_settop(L, 4);
  luaL_checkstack(L, ENTER_STACK, "async_hooks"); /* before anything changes */
  s = ah_slot_of(L, st);
  g = (ah_guard *)lua_newuserdatauv(L, sizeof(ah_guard), G_NUV); /* 5 */
  g->st = st;
  g->id = id;
  g->trigger = trigger;
  g->prev_id = st->slots[s].id;
  g->prev_trigger = st->slots[s].trigger;
  g->on_main = L == st->mainL;
  g->closed = g->out = 0;
  ah_auxt(L, AUX_GUARD_MT);
  lua_setmetatable(L, 5);
  lua_rawgeti(L, AH_UV_R, s);
  lua_setiuservalue(L, 5, G_PREV_RES);
  ah_frame_sync(L, st, s);
  lua_rawgeti(L, AH_UV_F, s);
  lua_setiuservalue(L, 5, G_PREV_FRAME);
  lua_pushvalue(L, 3);
  lua_setiuservalue(L, 5, G_RES);
  ah_reserve(L, s);
  if (!g->on_main) { /* link into the coroutine's chain */
    ah_get_guard(L, 0);
    lua_setiuservalue(L, 5, G_PREV_GUARD);
    ah_set_guard(L, 5);
    st->slots[s].scopes++;
  }
  /* nothing below can fail: switch */
  g->ov = st->ov.slot == s ? s : 0;
  if (g->ov) st->ov.slot = 0;
  st->slots[s].id = id;
  st->slots[s].trigger = trigger;
  ah_set_resource(L, s, 3);
  ah_set_frame(L, s, 4);
  if (g->on_main) st->active++;
  if (ah_unlikely(ah_emit_id(L, st, AH_BEFORE, id))) {
    /* an error of the dispatch (not the hook's own): the scope is left
    ** again (its after, the previous context), then the error is the
    ** entry's; fn does not run */
    ah_keep_first(L, 1, close_guard(L, st, g, 5));
    return ah_raise(L);
  }
  return 1;
}

/* leave the scope of the guard g at gidx: its after, the previous context
** back, on the main thread a flush point.  Returns 1 with the first error
** of the dispatches pushed, once all that is done. */
static int close_guard(lua_State *L, ah_state *st, ah_guard *g, int gidx) {
  int s, err = 0;
  g->closed = 1;
  if (!g->out) err = ah_emit_id(L, st, AH_AFTER, g->id);
  s = ah_slot_of(L, st);
  st->slots[s].id = g->prev_id;
  st->slots[s].trigger = g->prev_trigger;
  if (g->on_main) st->active--;
  lua_getiuservalue(L, gidx, G_PREV_RES);
  ah_set_resource(L, s, -1);
  lua_getiuservalue(L, gidx, G_PREV_FRAME);
  ah_set_frame(L, s, -1);
  lua_pop(L, 2);
  if (g->ov) st->ov.slot = g->ov;
  if (g->on_main) {
    if (ah_flush_due(st)) err = ah_keep_first(L, err, ah_flush_status(L, st));
  } else { /* unlink */
    lua_getiuservalue(L, gidx, G_PREV_GUARD);
    ah_set_guard(L, -1);
    lua_pop(L, 1);
    if (st->slots[s].scopes) st->slots[s].scopes--;
  }
  return err;
}

static int guard_close(lua_State *L) {
  ah_state *st = ah_st(L);
  ah_guard *g;
  /* the metatable is reachable from Lua: check self is a guard */
  g = (ah_guard *)ah_testudata(L, 1, sizeof(ah_guard), st);
  if (!g) return luaL_typeerror(L, 1, "async_hooks.scope");
  if (g->closed) return 0;
  /* an error of a dispatch is the scope exit's, raised once it is left */
  if (ah_unlikely(close_guard(L, st, g, 1))) return ah_raise(L);
  return 0;
}

/* emit a hook of `kind` for id as if running in (id, trigger, resource):
** the current thread's ids and resource are switched around the dispatch.
** Both resources stay on the stack meanwhile, so the switch writes R[s]
** only (no anchor write, nothing allocated): the thread's anchor keeps the
** previous one, and R[s] alone is restored unless something wrote a
** resource anchor meanwhile (counted in st->rgen: then in full). */
int ah_emit_as(lua_State *L, ah_state *st, int kind, lua_Integer id,
               lua_Integer trigger, int res_idx) {
  int s, had, pov, err;
  unsigned rgen;
  lua_Integer pid, ptrig;
  if (!st->nhooks[kind]) return 0;
  res_idx = lua_absindex(L, res_idx);
  /* both resources and the dispatch: nothing fails once the switch is made */
  luaL_checkstack(L, AH_EMIT_STACK + 4, "async_hooks");
  s = ah_slot_of(L, st);
  /* first (can fail): the thread's resource anchor key, so that the full
  ** restore below cannot allocate */
  if (!(st->slots[s].anchored & AKEY_RES)) ah_reserve_res(L, s);
  pid = st->slots[s].id;
  ptrig = st->slots[s].trigger;
  had = st->slots[s].anchored & A_RES;
  lua_rawgeti(L, AH_UV_R, s); /* the previous resource */
  if (ah_no_resource(L, res_idx)) {
    lua_pushboolean(L, 0); /* R[s] holds false for none */
    st->slots[s].anchored &= ~A_RES;
  } else {
    lua_pushvalue(L, res_idx);
    st->slots[s].anchored |= A_RES;
  }
  lua_rawseti(L, AH_UV_R, s);
  rgen = st->rgen;
  st->slots[s].id = id;
  st->slots[s].trigger = trigger;
  pov = st->ov.slot;
  if (pov == s) st->ov.slot = 0; /* a coroutine's event is being emitted */
  err = ah_emit_id(L, st, kind, id);
  if (err) lua_insert(L, -2); /* [error previous] */
  st->ov.slot = pov;
  st->slots[s].id = pid;
  st->slots[s].trigger = ptrig;
  if (st->rgen == rgen) {
    lua_pushvalue(L, -1);
    lua_rawseti(L, AH_UV_R, s);
    st->slots[s].anchored = (unsigned char)((st->slots[s].anchored & ~A_RES) | had);
  } else {
    ah_set_resource(L, s, -1);
  }
  lua_pop(L, 1);
  return err;
}

/* The coroutine at co_idx starts (AH_BEFORE) or ends (AH_AFTER) a resume
** slice: emit for its open scopes, outermost first for before, innermost
** first for after. */
/* push the open guards of the thread at thread_idx, innermost first (the
** outermost on top); returns how many */
static int push_guards(lua_State *L, int thread_idx) {
  int n = 0;
  const ah_state *st = ah_st(L);
  ah_get_guard(L, thread_idx);
  /* (guards only: the chain is reachable from Lua) */
  while (ah_testudata(L, -1, sizeof(ah_guard), st) != NULL) {
    n++;
    luaL_checkstack(L, 4, "async_hooks: too many open scopes");
    lua_getiuservalue(L, -1, G_PREV_GUARD);
  }
  lua_pop(L, 1);
  return n;
}

int ah_scopes_slice(lua_State *L, ah_state *st, int kind, int co_idx) {
  int n, i, err = 0, base = lua_gettop(L) + 2; /* innermost guard; outermost
                                               ** at base + n - 1 */
  lua_pushnil(L); /* base - 1: the first error of the dispatches */
  n = push_guards(L, co_idx);
  for (i = 0; i < n; i++) {
    int idx = kind == AH_BEFORE ? base + n - 1 - i : base + i;
    ah_guard *g = (ah_guard *)lua_touserdata(L, idx);
    if (g->closed || (kind == AH_BEFORE ? !g->out : g->out)) continue;
    lua_getiuservalue(L, idx, G_RES);
    /* a resource whose destroy was asked for (emitDestroy) while its
    ** scope was out keeps it out: its destroy is queued, maybe delivered,
    ** and comes after its last after */
    if (kind == AH_BEFORE && lua_type(L, -1) == LUA_TTABLE &&
        ah_resource_destroyed(L, -1)) {
      lua_pop(L, 1);
      continue;
    }
    g->out = kind == AH_AFTER;
    if (ah_unlikely(ah_emit_as(L, st, kind, g->id, g->trigger, -1))) {
      if (!err) lua_replace(L, base - 1); else lua_pop(L, 1);
      err = 1;
    }
    lua_pop(L, 1);
  }
  lua_settop(L, base - 1);
  if (!err) lua_pop(L, 1);
  return err;
}

static const luaL_Reg scope_funcs[] = {
  {"enter_scope", l_enter_scope},
  {NULL, NULL}
};

/* The own resource of the coroutine at thread_idx while scopes are open in
** it (a coroutine's before/after reports it, see ah_ov): the resource it
** had when its outermost open scope was entered, which that scope's exit
** gives back; made now ({thread = co}) and kept there if it had none.
** Pushes it and returns 1; 0 (nothing pushed) if no scope is open. */
static int own_resource(lua_State *L, int thread_idx) {
  int n;
  thread_idx = lua_absindex(L, thread_idx);
  luaL_checkstack(L, AH_RESOURCE_STACK + 2, "async_hooks");
  n = push_guards(L, thread_idx);
  if (n == 0) return 0;
  if (lua_getiuservalue(L, -1, G_PREV_RES) != LUA_TTABLE) { /* outermost's */
    lua_pop(L, 1);
    ah_new_thread_resource(L, thread_idx);
    lua_pushvalue(L, -1);
    lua_setiuservalue(L, -3, G_PREV_RES);
  }
  lua_replace(L, -(n + 1));
  lua_pop(L, n - 1);
  return 1;
}

/* module table on top: the guard metatable, enter_scope */
void ah_open_scope(lua_State *L) {
  ah_st(L)->own_resource = own_resource;
  ah_new_metatable(L, "async_hooks.scope", "__close", guard_close,
                   AUX_GUARD_MT);
  ah_add_funcs(L, scope_funcs);
}
