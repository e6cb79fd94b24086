-- The C files of the core call each other without a cycle, and their
-- #include lines draw the same graph: tests/callgraph.sh reads the ah_*
-- symbols each object defines and uses (nm) and the includes, and fails on
-- a loop.  The checker itself is tested on small fixtures, so that a
-- broken checker cannot pass src/ by accident.

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
    if name:find("/") then assert(sh("mkdir -p " .. dir .. "/" .. name:match("^(.*)/"))) end
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
  it("src/ has no cycle, one chain from base.c, anchors.c and slots.c up to module.c", function()
    local ok, out = check("src")
    assert(ok, out)
    assert.matches("no cycle", out)
    assert.matches("order, bottom first: base%.c anchors%.c queue%.c slots%.c .* module%.c $", out:match("order[^\n]*"))
    -- the slot store calls nothing but the anchors, the destroy queue and
    -- base.c, the anchors nothing but base.c's checks (luv's lazy
    -- resources and a coroutine's own resource under open scopes are
    -- function pointers set by ah_open_luv and ah_open_scope)
    assert.matches("\n  slots%.c %-> anchors%.c base%.c queue%.c\n", out)
    assert.matches("\n  anchors%.c %-> base%.c\n", out)
    assert.matches("\n  base%.c %-> \n", out)
    assert.matches("\n  queue%.c %-> \n", out)
    -- the luv files are in the graph; nothing below module.c calls them
    assert.matches("\n  luv/dispatch%.c %-> ", out)
    assert.matches("\n  module%.c %-> .*luv/register%.c", out)
    for line in out:gmatch("\n  ([^\n]*)") do
      if not line:match("^module%.c") and not line:match("^luv/") then
        assert.is_nil(line:match("luv/"), line)
      end
    end
  end)

  it("the checker reports a header that includes one above it", function()
    -- b.c is below a.c (a.c calls it), but b.h includes a.h
    local ok, out = check(fixture{
      ["a.h"] = "void ah_a(void);\n",
      ["b.h"] = "#include \"a.h\"\nvoid ah_b(void);\n",
      ["a.c"] = "#include \"b.h\"\nvoid ah_a(void) { ah_b(); }\n",
      ["b.c"] = "#include \"b.h\"\nvoid ah_b(void) {}\n",
    })
    assert.is_false(ok, out)
    assert.matches("include graph runs back up", out)
  end)

  it("the checker reports a call whose header is not included", function()
    local ok, out = check(fixture{
      ["b.h"] = "void ah_b(void);\n",
      ["a.c"] = "void ah_b(void);\nvoid ah_a(void) { ah_b(); }\n",
      ["b.c"] = "#include \"b.h\"\nvoid ah_b(void) {}\n",
    })
    assert.is_false(ok, out)
    assert.matches("a%.c calls b%.c without including its header", out)
  end)

  it("a folder's private header serves its files; the folder is in the graph", function()
    local ok, out = check(fixture{
      ["base.h"] = "void ah_base(void);\n",
      ["base.c"] = "#include \"base.h\"\nvoid ah_base(void) {}\n",
      ["sub/p.h"] = "#include \"../base.h\"\nvoid ah_x(void);\nvoid ah_y(void);\n",
      ["sub/x.c"] = "#include \"p.h\"\nvoid ah_x(void) { ah_base(); ah_y(); }\n",
      ["sub/y.c"] = "#include \"p.h\"\nvoid ah_y(void) {}\n",
    })
    assert(ok, out)
    assert.matches("\n  sub/x%.c %-> base%.c sub/y%.c\n", out)
    assert.matches("order, bottom first: base%.c sub/y%.c sub/x%.c", out)
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
      ["b.h"] = "int ah_b(void);\n",
      ["a.c"] = "#include \"b.h\"\nconst char ah_key = 1;\nint ah_a(void) { return ah_b(); }\n",
      ["b.c"] = "extern const char ah_key;\nint ah_b(void) { return ah_key; }\n",
    })
    assert(ok, out)
    assert.matches("order, bottom first: b%.c a%.c", out)
    assert.matches("\n  b%.c %-> \n", out)
  end)

  it("the checker accepts a chain and rejects a stray global symbol", function()
    local ok, out = check(fixture{
      ["b.h"] = "void ah_b(void);\n",
      ["a.c"] = "#include \"b.h\"\nvoid ah_a(void) { ah_b(); }\n",
      ["b.c"] = "#include \"b.h\"\nvoid ah_b(void) {}\n",
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
