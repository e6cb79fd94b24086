-- The backend contract: async_hooks.api checks, when it is called with a
-- backend, that every field it needs is there with the right type, and
-- fails naming the first one that is not.
local api = require("async_hooks.api")
local lua54 = require("async_hooks.backend.lua54")

local OPTIONAL = { runner = true, luv_covered = true, set_libdir = true }

-- a copy of the real backend, with a fresh persist so that the api builds
-- a module of its own instead of returning the installed one
local function backend(changes)
  local b = {}
  for k, v in pairs(lua54) do b[k] = v end
  b.persist = {}
  for k, v in pairs(changes or {}) do b[k] = v end
  return b
end

local function without(name)
  local b = backend()
  b[name] = nil
  return b
end

-- every B.<field> that api.lua reads
local function fields_read()
  local path = package.searchpath("async_hooks.api", package.path)
  local f = assert(io.open(path))
  local src = f:read("a")
  f:close()
  local seen, list = {}, {}
  for name in src:gmatch("B%.([%a_][%w_]*)") do
    if not seen[name] then seen[name] = true; list[#list + 1] = name end
  end
  table.sort(list)
  return list
end

describe("the backend contract", function()
  it("accepts the real backend", function()
    local m = api(backend())
    assert.equal("lua54", m.backend)
    assert.is_function(m.AsyncLocal.new)
  end)

  it("names every field api.lua reads: a missing one fails naming it, or is optional", function()
    local list = fields_read()
    assert.is_true(#list >= 25, "found " .. #list)
    for _, name in ipairs(list) do
      local ok, e = pcall(api, without(name))
      if OPTIONAL[name] then
        assert.is_true(ok, name .. ": " .. tostring(e))
      else
        assert.is_false(ok, name)
        assert.matches("async_hooks.api: backend field '" .. name .. "' %(%a+ expected, got nil%)", e)
      end
    end
  end)

  it("fails at the caller's line", function()
    local line = debug.getinfo(1, "l").currentline + 1
    local ok, e = pcall(function() local _ = api(without("getter")) end)
    assert.is_false(ok)
    assert.equal("19-backend_contract_spec.lua:" .. line ..
      ": async_hooks.api: backend field 'getter' (function expected, got nil)", e:match("[^/]*$"))
  end)

  it("fails on a field of the wrong type, optional ones included", function()
    for _, name in ipairs(fields_read()) do
      local kind = type(lua54[name])
      local wrong = kind == "function" and {} or function() end
      local ok, e = pcall(api, backend { [name] = wrong })
      assert.is_false(ok, name)
      assert.matches("async_hooks.api: backend field '" .. name .. "' %(" .. kind .. " expected, got " ..
        type(wrong) .. "%)", e)
    end
  end)

  it("fails on a backend that is not a table", function()
    local ok, e = pcall(api, 42)
    assert.is_false(ok)
    assert.matches("async_hooks.api: backend table expected, got number", e, nil, true)
  end)

  it("checks before it uses anything: a cached module is not returned for a broken backend", function()
    local b = backend()
    local m = api(b)
    b.flush = nil
    local ok, e = pcall(api, b)
    assert.is_false(ok)
    assert.matches("backend field 'flush'", e, nil, true)
    b.flush = lua54.flush
    assert.equal(m, api(b))
  end)
end)
