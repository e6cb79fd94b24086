/*
** failalloc.c - fault injection: run a Lua workload in a lua_State whose
** allocator fails the Nth growing allocation and every one after it (or,
** with AH_FAULTS_ONCE=1, the Nth only: it and Lua's retry of it after an
** emergency collection, so that the program goes on with memory again),
** for N = 1..K, each in a child
** process, and check that the library raised a Lua error (or let one
** through) and left its state usable: no crash (built with ASan), no
** corruption, nothing stuck, no leak, and no exit: a memory error inside a
** hook is not the hook's own error and must not end the process (a "fatal"
** hook error is counted, and fails the run).
**
** usage: failalloc SCRIPT K
** SCRIPT returns {setup = f, work = f, check = f}; setup and check run with
** a working allocator, work with the failing one.
*/
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lauxlib.h"
#include "lua.h"
#include "lualib.h"

typedef struct {
  long count;
  long fail_at; /* -1: never */
  long failed;
  int once;     /* fail the fail_at-th allocation only (and its retry) */
} faults;

static void *alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  faults *f = (faults *)ud;
  if (nsize == 0) {
    free(ptr);
    return NULL;
  }
  /* Lua assumes shrinking never fails: only growth can */
  if ((ptr == NULL || nsize > osize) && f->fail_at >= 0 && ++f->count >= f->fail_at &&
      (!f->once || f->count <= f->fail_at + 1)) {
    f->failed++;
    return NULL;
  }
  return realloc(ptr, nsize);
}

static int call_field(lua_State *L, const char *name) {
  int status;
  lua_getfield(L, 1, name);
  status = lua_pcall(L, 0, 0, 0);
  if (status != LUA_OK) {
    fprintf(stderr, "%s: %s\n", name, lua_tostring(L, -1));
    lua_pop(L, 1);
  }
  return status;
}

/* one run: exit 0 ok, 2 bad state, 3 setup failed, 4 the workload no
** longer fails (all allocations covered), 5 ok after an error */
static int run(const char *script, long n) {
  faults f = {0, -1, 0, 0};
  lua_State *L = lua_newstate(alloc, &f);
  int status, code;
  if (!L) return 3;
  /* AH_FAULTS_HOSTEXTRA=1: a host that keeps data in LUA_EXTRASPACE and
  ** says so (the registry field the module reads); else one that leaves
  ** the bytes as allocated (Lua does not initialize the main thread's) */
  if (getenv("AH_FAULTS_HOSTEXTRA") && atoi(getenv("AH_FAULTS_HOSTEXTRA"))) {
    memset(lua_getextraspace(L), 0x5a, LUA_EXTRASPACE);
    lua_pushboolean(L, 1);
    lua_setfield(L, LUA_REGISTRYINDEX, "async_hooks.host_extraspace");
  }
  luaL_openlibs(L);
  if (luaL_dofile(L, script) != LUA_OK || !lua_istable(L, -1)) {
    fprintf(stderr, "loading %s: %s\n", script, lua_tostring(L, -1));
    return 3;
  }
  lua_settop(L, 1); /* the table the script returned */
  if (call_field(L, "setup") != LUA_OK) return 3;
  f.count = 0;
  f.once = getenv("AH_FAULTS_ONCE") && atoi(getenv("AH_FAULTS_ONCE"));
  f.fail_at = n;
  lua_getfield(L, 1, "work");
  status = lua_pcall(L, 0, 0, 0);
  f.fail_at = -1;
  if (status != LUA_OK) lua_pop(L, 1);
  code = status != LUA_OK ? 5 : 0;
  if (call_field(L, "check") != LUA_OK) {
    fprintf(stderr, "state not intact after failing allocation %ld\n", n);
    code = 2;
  }
  if (f.failed == 0 && code == 0) code = 4;
  lua_close(L);
  return code;
}

int main(int argc, char **argv) {
  long k, n, errors = 0, fatal = 0, bad = 0, ok = 0;
  char errpath[] = "/tmp/failallocXXXXXX";
  int errfd = mkstemp(errpath);
  if (argc < 3 || errfd < 0) {
    fprintf(stderr, "usage: %s SCRIPT K\n", argv[0]);
    return 2;
  }
  k = atol(argv[2]);
  for (n = 1; n <= k; n++) {
    int st;
    pid_t pid;
    fflush(stdout);
    if (ftruncate(errfd, 0) != 0 || lseek(errfd, 0, SEEK_SET) != 0) return 2;
    pid = fork();
    if (pid == 0) {
      dup2(errfd, 2);
      exit(run(argv[1], n));
    }
    waitpid(pid, &st, 0);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 4) break; /* covered every allocation */
    if (WIFEXITED(st) && (WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == 5)) {
      ok++;
      errors += WEXITSTATUS(st) == 5;
      continue;
    }
    {
      char buf[4096];
      ssize_t got = pread(errfd, buf, sizeof buf - 1, 0);
      buf[got > 0 ? got : 0] = 0;
      if (strstr(buf, "hook (fatal)")) fatal++;
      bad++;
      fprintf(stderr, "== failing allocation %ld: %s %d\n%s\n", n,
              WIFSIGNALED(st) ? "signal" : "exit status",
              WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st), buf);
      if (bad >= 5) break;
    }
  }
  close(errfd);
  unlink(errpath);
  printf("fault injection: %ld allocation points, %ld runs raised an error and recovered, "
         "%ld ended in a fatal hook error, %ld failed\n", n - 1, errors, fatal, bad);
  return bad ? 1 : 0;
}
