-- The C files of the core call each other without a cycle (issue 11):
-- tests/callgraph.sh reads the ah_* symbols each object defines and uses
-- (nm) and fails on a loop.  The checker itself is tested on small
-- fixtures, so that a broken checker cannot pass src/ by accident.

local function sh(cmd)
  -- no sanitizer runtime preloaded into the compiler (make asan)
  local p = io.popen("env -u LD_PRELOAD " .. cmd .. " 2>&1")
  local out = p:read("a")
  local ok = p:close()
  return ok == true, out
end

-- a temporary source folder with the given files
local function fixture(files)
  local dir = os.tmpname()
  os.remove(dir)
  assert(sh("mkdir -p " .. dir))
  for name, text in pairs(files) do
    local f = assert(io.open(dir .. "/" .. name, "w"))
    f:write(text)
    f:close()
  end
  return dir
end

local function check(dir)
  local ok, out = sh("tests/callgraph.sh " .. dir)
  if dir:sub(1, 1) == "/" then sh("rm -rf " .. dir) end
  return ok, out
end

describe("the C call graph #callgraph", function()
  it("src/ has no cycle, one chain from base.c, anchors.c and slots.c up to core.c", function()
    local ok, out = check("src")
    assert(ok, out)
    assert.matches("no cycle", out)
    assert.matches("order, bottom first: base%.c anchors%.c slots%.c .* core%.c", out)
    -- the slot store calls nothing but the anchors and base.c, the anchors
    -- nothing but base.c's checks (luv's lazy resources and a coroutine's
    -- own resource under open scopes are function pointers set by
    -- ah_open_luv and ah_open_scope)
    assert.matches("\n  slots%.c %-> anchors%.c base%.c\n", out)
    assert.matches("\n  anchors%.c %-> base%.c\n", out)
    assert.matches("\n  base%.c %-> \n", out)
  end)

  it("the checker reports a loop between two files", function()
    local ok, out = check(fixture{
      ["a.c"] = "void ah_b(void);\nvoid ah_a(void) { ah_b(); }\n",
      ["b.c"] = "void ah_a(void);\nvoid ah_b(void) { ah_a(); }\n",
    })
    assert.is_false(ok, out)
    assert.matches("has a cycle", out)
    assert.matches("a%.c %-> b%.c", out)
  end)

  it("a shared data symbol is no call: no loop through it", function()
    -- b.c reads a key defined in a.c, which calls b.c
    local ok, out = check(fixture{
      ["a.c"] = "int ah_b(void);\nconst char ah_key = 1;\nint ah_a(void) { return ah_b(); }\n",
      ["b.c"] = "extern const char ah_key;\nint ah_b(void) { return ah_key; }\n",
    })
    assert(ok, out)
    assert.matches("order, bottom first: b%.c a%.c", out)
    assert.matches("\n  b%.c %-> \n", out)
  end)

  it("the checker accepts a chain and rejects a stray global symbol", function()
    local ok, out = check(fixture{
      ["a.c"] = "void ah_b(void);\nvoid ah_a(void) { ah_b(); }\n",
      ["b.c"] = "void ah_b(void) {}\n",
    })
    assert(ok, out)
    assert.matches("order, bottom first: b%.c a%.c", out)
    ok, out = check(fixture{
      ["a.c"] = "int leaked(void) { return 1; }\n",
    })
    assert.is_false(ok, out)
    assert.matches("a%.c: leaked", out)
  end)
end)
