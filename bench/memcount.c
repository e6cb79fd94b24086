/* memcount: the bytes the C allocator has handed out and not taken back
 * (glibc mallinfo2: in-use chunks in every arena plus mmapped chunks).
 * The Lua heap is part of it (lua5.4's allocator is realloc/free), and so
 * is whatever luv, libuv or the library allocate with malloc, which
 * collectgarbage("count") does not see.  Built by bench/mem_case.lua into a
 * temporary file; require-free: loaded with package.loadlib. */
#include <malloc.h>
#include "lua.h"

static int l_live(lua_State *L) {
  struct mallinfo2 mi = mallinfo2();
  lua_pushinteger(L, (lua_Integer)(mi.uordblks + mi.hblkhd));
  return 1;
}

int luaopen_memcount(lua_State *L);
int luaopen_memcount(lua_State *L) {
  lua_pushcfunction(L, l_live);
  return 1;
}
