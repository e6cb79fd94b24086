/*
** frames.c - immutable copy-on-write frames and context values.
**
** A frame is a table {token -> value} with weak keys (an ephemeron table):
** every AsyncLocal holds a token userdata, and disable() swaps in a fresh
** token, so every value stored under the old one becomes collectable in every
** frame at once.  Frames are never modified after creation; set/run build a
** new one.  An explicit nil is stored as the NILV light userdata so that it
** shadows the default.  The frame metatable's __close restores a frame, which
** lets Lua code write scopes as `local prev <close> = enter(...)`.
*/
#include "frames.h"
#include "base.h"
#include "slots.h"
#include "anchors.h"
#include "hooks.h"

#define AH_TOKEN_MAGIC 0x41484c54u

typedef struct ah_token {
  const void *null; /* (see ah.h, AH_NULLOBJ) */
  unsigned int magic;
} ah_token;

static const void *const ah_nilv = NULL; /* (see ah.h, AH_NULLOBJ) */
#define NILV ((void *)&ah_nilv)

/* 1 with the token of the AsyncLocal at idx pushed, or 0 */
static int token_of(lua_State *L, int idx) {
  if (lua_type(L, idx) == LUA_TTABLE) {
    if (lua_rawgeti(L, idx, 1) == LUA_TUSERDATA &&
        lua_rawlen(L, -1) == sizeof(ah_token) &&
        ((ah_token *)lua_touserdata(L, -1))->magic == AH_TOKEN_MAGIC)
      return 1;
    lua_pop(L, 1);
  }
  return 0;
}

/* Closures made by getter()/setter() carry the names for their error
** message as two extra upvalues (method, class); the plain get/set do not. */
#define AH_UV_METHOD lua_upvalueindex(AH_NUP + 1)
#define AH_UV_CLASS lua_upvalueindex(AH_NUP + 2)

/* raise the bad-self error of get/set at the caller's line */
static int bad_self(lua_State *L) {
  const char *got;
  if (lua_type(L, AH_UV_CLASS) != LUA_TSTRING)
    return luaL_typeerror(L, 1, "AsyncLocal");
  got = luaL_typename(L, 1);
  if (luaL_getmetafield(L, 1, "__name") == LUA_TSTRING)
    got = lua_tostring(L, -1);
  ah_where(L, 1);
  lua_pushfstring(L, "calling '%s' on bad self (%s expected, got %s)",
                  lua_tostring(L, AH_UV_METHOD), lua_tostring(L, AH_UV_CLASS),
                  got);
  lua_concat(L, 2);
  return lua_error(L);
}

/* push the token of the AsyncLocal at idx, or raise */
static void push_token(lua_State *L, int idx) {
  if (!token_of(L, idx)) bad_self(L);
}

/* get() is the hot path: only a table whose [1] is a full userdata gets
** past the type checks (any other userdata there is just a key that is in
** no frame: get() returns the default, nothing unsafe happens) */
static int l_get(lua_State *L) {
  ah_state *st = ah_st(L);
  int s;
  if (lua_type(L, 1) != LUA_TTABLE) bad_self(L);
  s = ah_slot_of(L, st);
  ah_frame_sync(L, st, s);
  /* (lua_geti: an F that the debug library replaced raises, and costs
  ** no check when it is a table) */
  if (lua_geti(L, AH_UVI_F, s) != LUA_TTABLE) { /* only after an OOM */
    lua_pop(L, 1);
    ah_auxt(L, AUX_EMPTY);
  }
  if (lua_rawgeti(L, 1, 1) != LUA_TUSERDATA) bad_self(L);
  switch (lua_rawget(L, -2)) {
    case LUA_TNIL: lua_getfield(L, 1, "default"); break;
    case LUA_TLIGHTUSERDATA:
      if (lua_touserdata(L, -1) == NILV) lua_pushnil(L);
      break;
    default: break;
  }
  return 1;
}

/* a value of type t refers to no object: nothing it holds can reach a
** thread */
static int plain_type(int t) {
  switch (t) {
    case LUA_TNIL: case LUA_TBOOLEAN: case LUA_TNUMBER: case LUA_TSTRING:
    case LUA_TLIGHTUSERDATA: return 1;
    default: return 0;
  }
}

/* what push_frame_with pushed above F[s] */
enum { SAME_FRAME = 0, NEW_FRAME, NEW_PLAIN_FRAME };

/* push F[s] and, above it, F[s] with tok -> val (absolute indices): a new
** frame (returns NEW_FRAME, or NEW_PLAIN_FRAME when it is plain: see
** ah_frame_plain), or F[s] again when it already maps tok to that very
** value (returns SAME_FRAME).
** The size of the frame made last is remembered (st->lastf, st->lastn), so
** the usual set() on the frame the previous set() made skips counting its
** entries.  That is exact: every frame is made here (the frame metatable is
** protected by __metatable, so Lua code cannot make one), frames are never
** written after they are made, and a frame's address can be that of the
** frame made last only if it is that frame, alive (a frame made later at a
** reused address would itself be the one made last).  Entries that the
** collector removed (a token dropped by disable()) only make n an upper
** bound: n sizes the new table and decides whether to copy, and the copy
** walks the entries that are there. */
static int push_frame_with(lua_State *L, ah_state *st, int s, int tok,
                           int val) {
  int fr, nf, n = 0, had = 0, vt = lua_type(L, val), plain;
  const void *p;
  ah_frame_sync(L, st, s);
  if (lua_geti(L, AH_UVI_F, s) != LUA_TTABLE) { /* only after an OOM (geti:
                                                 ** see l_get) */
    lua_pop(L, 1);
    ah_auxt(L, AUX_EMPTY);
  }
  fr = lua_gettop(L);
  p = lua_topointer(L, fr);
  /* plain: the value and the entries copied are (an entry replaced in a
  ** frame that is not plain counts as not) */
  plain = plain_type(vt);
  if (p != st->empty) { /* (the empty frame: nothing to look up or copy) */
    lua_pushvalue(L, tok);
    had = lua_rawget(L, fr) != LUA_TNIL;
    if (had && (vt == LUA_TNIL ? lua_touserdata(L, -1) == NILV
                               : lua_rawequal(L, -1, val))) {
      lua_pushvalue(L, fr);
      lua_replace(L, -2);
      return SAME_FRAME;
    }
    lua_pop(L, 1);
    if (p == st->lastf) { /* the frame made last: its size is known */
      n = st->lastn;
      plain = plain && st->lastplain;
    } else {
      lua_pushnil(L);
      while (lua_next(L, fr)) {
        n++;
        lua_pop(L, 1);
      }
      plain = plain && ah_frame_plain(L, st, fr);
    }
  }
  lua_createtable(L, 0, n + !had);
  nf = fr + 1;
  if (n > had) { /* copy the other entries */
    lua_pushnil(L);
    while (lua_next(L, fr)) {
      lua_pushvalue(L, -2);
      lua_insert(L, -2);
      lua_rawset(L, nf);
    }
  }
  lua_pushvalue(L, tok);
  if (vt == LUA_TNIL)
    lua_pushlightuserdata(L, NILV);
  else
    lua_pushvalue(L, val);
  lua_rawset(L, nf);
  if (ah_unlikely(lua_rawgeti(L, AH_UV_AUX, plain ? AUX_FRAME_PMT
                                                  : AUX_FRAME_MT) !=
                  LUA_TTABLE)) {
    lua_pop(L, 1);
    ah_auxt(L, plain ? AUX_FRAME_PMT : AUX_FRAME_MT); /* raises */
  }
  lua_setmetatable(L, nf);
  st->lastf = lua_topointer(L, nf); /* complete: remember it */
  st->lastn = n + !had;
  st->lastplain = plain;
  return plain ? NEW_PLAIN_FRAME : NEW_FRAME;
}

/* v:set(value) */
static int l_set(lua_State *L) {
  ah_state *st = ah_st(L);
  int s, made;
  if (lua_gettop(L) != 2) lua_settop(L, 2);
  push_token(L, 1); /* 3 */
  s = ah_slot_of(L, st);
  made = push_frame_with(L, st, s, 3, 2); /* 4: previous, 5: new */
  if (made != SAME_FRAME)
    ah_set_new_frame(L, st, s, 5, made == NEW_PLAIN_FRAME);
  return 0;
}

/* An error in the name of the Lua function that called us (level 1),
** positioned at its caller (level 2), as if that function had raised it. */
static int caller_error(lua_State *L, const char *fmt, const char *fname,
                        int idx) {
  const char *got = luaL_typename(L, idx);
  if (luaL_getmetafield(L, idx, "__name") == LUA_TSTRING)
    got = lua_tostring(L, -1);
  ah_where(L, 2);
  lua_pushfstring(L, fmt, fname, got);
  lua_concat(L, 2);
  return lua_error(L);
}

/* The closure made by enterer(message) raises message(v, value, fn) (a
** string) at its caller's caller instead of its own messages. */
#define AH_UV_MESSAGE lua_upvalueindex(AH_NUP + 1)

static int enter_error(lua_State *L, const char *fmt, int idx) {
  if (lua_type(L, AH_UV_MESSAGE) != LUA_TFUNCTION)
    return caller_error(L, fmt, "run", idx);
  lua_pushvalue(L, AH_UV_MESSAGE);
  lua_pushvalue(L, 1);
  lua_pushvalue(L, 2);
  lua_pushvalue(L, 3);
  lua_call(L, 3, 1);
  ah_where(L, 2);
  lua_insert(L, -2);
  lua_concat(L, 2);
  return lua_error(L);
}

/* enter(v, value, fn) -> previous frame: the scope entry of run(); the
** caller holds the result in a to-be-closed variable, whose __close
** restores it.  Checks its arguments in the name of 'run'. */
static int l_enter_frame(lua_State *L) {
  ah_state *st = ah_st(L);
  int s, made;
  lua_settop(L, 3);
  if (!token_of(L, 1))
    return enter_error(L, "calling '%s' on bad self (AsyncLocal expected, got %s)", 1);
  if (!ah_callable(L, 3))
    return enter_error(L, "bad argument #2 to '%s' (function expected, got %s)", 3);
  s = ah_slot_of(L, st);
  made = push_frame_with(L, st, s, 4, 2); /* 5: previous, 6: new */
  if (made != SAME_FRAME)
    ah_set_new_frame(L, st, s, 6, made == NEW_PLAIN_FRAME);
  lua_settop(L, 5);
  return 1;
}

static void check_frame(lua_State *L, int idx) {
  int ok = lua_getmetatable(L, idx);
  if (ok) {
    const void *mt = lua_topointer(L, -1);
    lua_rawgeti(L, AH_UV_AUX, AUX_FRAME_MT);
    ok = mt == lua_topointer(L, -1) || mt == ah_st(L)->plain_mt;
    lua_pop(L, 2);
  }
  if (!ok || lua_type(L, idx) != LUA_TTABLE) luaL_typeerror(L, idx, "frame");
}

/* swap(frame) -> previous frame */
static int l_swap(lua_State *L) {
  ah_state *st = ah_st(L);
  int s;
  check_frame(L, 1);
  s = ah_slot_of(L, st);
  ah_frame_sync(L, st, s);
  lua_rawgeti(L, AH_UV_F, s);
  ah_set_frame(L, s, 1);
  return 1;
}

/* __close of a frame: make it current again.  A scope (run, Snapshot:run,
** a wrapped function) returning outside any callback, resume or hook is a
** flush point: queued destroys are delivered there (a scope inside a
** coroutine ends inside its resume, whose end delivers them) */
static int frame_close(lua_State *L) {
  ah_state *st = ah_st(L);
  ah_set_frame(L, ah_slot_of(L, st), 1);
  if (ah_unlikely(st->dq_n || st->notify_pending) && L == st->mainL)
    ah_flush_maybe(L, st);
  return 0;
}

static int l_current_frame(lua_State *L) {
  ah_state *st = ah_st(L);
  int s = ah_slot_of(L, st);
  ah_frame_sync(L, st, s);
  lua_rawgeti(L, AH_UV_F, s);
  return 1;
}

static int l_newtoken(lua_State *L) {
  ah_token *t = (ah_token *)lua_newuserdatauv(L, sizeof(ah_token), 0);
  t->null = NULL;
  t->magic = AH_TOKEN_MAGIC;
  ah_internal_mt(L, -1);
  return 1;
}

static int l_empty_frame(lua_State *L) {
  lua_rawgeti(L, AH_UV_AUX, AUX_EMPTY);
  return 1;
}

/* f as a closure with the shared upvalues and then the n arguments */
static int closure_with(lua_State *L, lua_CFunction f, int n) {
  int i;
  lua_settop(L, n);
  luaL_checkstack(L, AH_NUP + n, NULL);
  ah_push_shared(L);
  for (i = 1; i <= n; i++) lua_pushvalue(L, i);
  lua_pushcclosure(L, f, AH_NUP + n);
  return 1;
}

/* getter(method, class) / setter(method, class): get / set as a closure
** whose bad-self error names that method and class */
static int l_getter(lua_State *L) {
  luaL_checkstring(L, 1);
  luaL_checkstring(L, 2);
  return closure_with(L, l_get, 2);
}

static int l_setter(lua_State *L) {
  luaL_checkstring(L, 1);
  luaL_checkstring(L, 2);
  return closure_with(L, l_set, 2);
}

/* enterer(message): enter whose errors are message(v, value, fn) */
static int l_enterer(lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  return closure_with(L, l_enter_frame, 1);
}

/* number of live entries of a frame (tests and benchmarks) */
static int l_frame_size(lua_State *L) {
  lua_Integer n = 0;
  check_frame(L, 1);
  lua_pushnil(L);
  while (lua_next(L, 1)) {
    n++;
    lua_pop(L, 1);
  }
  lua_pushinteger(L, n);
  return 1;
}

static const luaL_Reg frame_funcs[] = {
  {"get", l_get},
  {"set", l_set},
  {"enter", l_enter_frame},
  {"swap", l_swap},
  {"current_frame", l_current_frame},
  {"empty_frame", l_empty_frame},
  {"getter", l_getter},
  {"setter", l_setter},
  {"enterer", l_enterer},
  {"newtoken", l_newtoken},
  {"frame_size", l_frame_size},
  {NULL, NULL}
};

/* module table on top: the frame metatable, the empty frame, the frame
** functions */
void ah_open_frames(lua_State *L) {
  lua_createtable(L, 0, 4);
  lua_pushliteral(L, "k");
  lua_setfield(L, -2, "__mode");
  lua_pushliteral(L, "async_hooks.frame");
  lua_setfield(L, -2, "__name");
  lua_pushliteral(L, "async_hooks.frame");
  lua_setfield(L, -2, "__metatable");
  ah_push_shared(L);
  lua_pushcclosure(L, frame_close, AH_NUP);
  lua_setfield(L, -2, "__close");
  lua_pushvalue(L, -1);
  lua_rawseti(L, AH_UV_AUX, AUX_FRAME_MT);
  /* plain frames' metatable: the same fields, another identity */
  lua_createtable(L, 0, 4);
  lua_pushnil(L);
  while (lua_next(L, -3)) {
    lua_pushvalue(L, -2);
    lua_insert(L, -2);
    lua_rawset(L, -4);
  }
  ah_st(L)->plain_mt = lua_topointer(L, -1);
  lua_rawseti(L, AH_UV_AUX, AUX_FRAME_PMT);
  lua_newtable(L);
  lua_insert(L, -2);
  lua_setmetatable(L, -2);
  ah_st(L)->empty = lua_topointer(L, -1);
  lua_rawseti(L, AH_UV_AUX, AUX_EMPTY);
  ah_add_funcs(L, frame_funcs);
}
