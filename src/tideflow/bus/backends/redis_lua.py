"""The Lua scripts of the Redis Streams bus: each one server round trip, applied atomically.

Entries are addressed as (stream, id, times delivered): a settle, extend or hand-back
checks in the pending entries list (PEL) that the entry is still with this consumer at
that delivery count, so a delivery whose lease ran out (and that went to someone else, or
came again to this consumer) changes nothing when it is settled late.

A fields list on a stream is ``b`` (the body, JSON), ``h`` (headers, JSON, when there are
any) and ``d`` (deliveries before this entry was added, when it was handed back).
"""

from __future__ import annotations

_HELPERS = """
local function held(stream, group, me, id, count)
  local ok, p = pcall(redis.call, 'XPENDING', stream, group, id, id, 1)
  return ok and p[1] ~= nil and p[1][2] == me and tonumber(p[1][4]) == tonumber(count)
end
local function times(stream, group, id)
  local p = redis.call('XPENDING', stream, group, id, id, 1)
  if p[1] then return tonumber(p[1][4]) end
  return 1
end
local function last_id(stream)
  local r = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
  if r[1] then return r[1][1] end
  return '0-0'
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function add(stream, b, h, d)
  local fields = {'XADD', stream, '*', 'b', b}
  if h ~= '' then fields[#fields + 1] = 'h'; fields[#fields + 1] = h end
  if tonumber(d) > 0 then fields[#fields + 1] = 'd'; fields[#fields + 1] = d end
  redis.call(unpack(fields))
end
-- XREADGROUP of new entries; a missing group (a stream deleted by hand) is created again
local function readgroup(stream, group, me, count)
  local ok, r = pcall(redis.call, 'XREADGROUP', 'GROUP', group, me, 'COUNT', count,
                      'STREAMS', stream, '>')
  if not ok and string.find(tostring(r.err or r), 'NOGROUP') then
    redis.call('XGROUP', 'CREATE', stream, group, '0', 'MKSTREAM')
    ok, r = pcall(redis.call, 'XREADGROUP', 'GROUP', group, me, 'COUNT', count,
                  'STREAMS', stream, '>')
  end
  if not ok or not r then return {} end
  return r[1][2]
end
-- expired entries of a stream claimed to me, oldest first: {key index, id, fields, times}
local function reclaim(index, group, me, min_idle, want, out)
  local stream = KEYS[index]
  local cursor = '0-0'
  for _ = 1, 1000 do
    if want <= 0 then break end
    local ok, r = pcall(redis.call, 'XAUTOCLAIM', stream, group, me, min_idle, cursor,
                        'COUNT', want)
    if not ok then break end
    for _, e in ipairs(r[2]) do
      if e and e[2] then
        out[#out + 1] = {index, e[1], e[2], times(stream, group, e[1])}
        want = want - 1
      end
    end
    cursor = r[1]
    if cursor == '0-0' then break end
  end
  return want
end
"""

TAKE_TASKS = (
    _HELPERS
    + """
-- KEYS: three streams per queue (high, normal, low). ARGV: group, me, count, cycle
-- position, queue turn, cycle (ranks as digits), min idle for a sweep (-1: no sweep).
-- Returns {entries, cycle position, turn, last ids (only when nothing was taken)}.
local group, me = ARGV[1], ARGV[2]
local count, cursor, turn = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local cycle, min_idle = ARGV[6], tonumber(ARGV[7])
local nq = #KEYS / 3
local out = {}
if min_idle >= 0 then
  for i = 1, #KEYS do count = reclaim(i, group, me, min_idle, count, out) end
end
local empty = {}
local function read(index)
  if empty[index] then return nil end
  local r = readgroup(KEYS[index], group, me, 1)
  if not r[1] then empty[index] = true; return nil end
  return r[1]
end
local function first_of(rank)
  for j = 0, nq - 1 do
    local index = 3 * ((turn + j) % nq) + rank + 1
    local e = read(index)
    if e then return index, e end
  end
  return nil, nil
end
for _ = 1, count do
  if nq == 0 then break end
  turn = (turn + 1) % nq
  local want = tonumber(string.sub(cycle, cursor + 1, cursor + 1))
  local index, e = first_of(want)
  local rank = 0
  while not e and rank < 3 do index, e = first_of(rank); rank = rank + 1 end
  if not e then break end
  cursor = (cursor + 1) % #cycle
  out[#out + 1] = {index, e[1], e[2], 1}
end
local last = {}
if #out == 0 then for i = 1, #KEYS do last[i] = last_id(KEYS[i]) end end
return {out, cursor, turn, last}
"""
)

TAKE_EVENTS = (
    _HELPERS
    + """
-- KEYS: the partition streams, in the order to read them. ARGV: group, me, count, min
-- idle for a sweep (-1: no sweep). Returns {entries}: when there are none the consumer
-- waits with XREADGROUP BLOCK, which takes the next ones as they come.
local group, me = ARGV[1], ARGV[2]
local count, min_idle = tonumber(ARGV[3]), tonumber(ARGV[4])
local out = {}
for i = 1, #KEYS do
  if count <= 0 then break end
  if min_idle >= 0 then count = reclaim(i, group, me, min_idle, count, out) end
  if count > 0 then
    for _, e in ipairs(readgroup(KEYS[i], group, me, count)) do
      out[#out + 1] = {i, e[1], e[2], 1}
      count = count - 1
    end
  end
end
return {out}
"""
)

SETTLE = (
    _HELPERS
    + """
-- KEYS: the delayed set, then the stream of each entry. ARGV: group, me, delay in ms (-1:
-- acknowledge; 0: add again now; more: add again then), a unique token, then five per
-- entry: id, times delivered, body, headers, deliveries so far. Returns how many settled.
local group, me, delay, token = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local again = {}
local done = 0
for i = 2, #KEYS do
  local a = 5 + (i - 2) * 5
  local stream, id = KEYS[i], ARGV[a]
  if held(stream, group, me, id, ARGV[a + 1]) then
    redis.call('XACK', stream, group, id)
    redis.call('XDEL', stream, id)
    done = done + 1
    if delay >= 0 then
      again[#again + 1] = {stream, ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]}
    end
  end
end
if #again > 0 then
  if delay == 0 then
    for _, e in ipairs(again) do add(e[1], e[2], e[3], e[4]) end
  else
    local due = string.format('%.0f', now_ms() + delay)
    redis.call('ZADD', KEYS[1], due, cjson.encode({t = token, e = again}))
  end
end
return done
"""
)

TOUCH = (
    _HELPERS
    + """
-- KEYS: the stream of each entry. ARGV: group, me, the consumer to give them to, the
-- idle time to set (ms), then two per entry: id, times delivered. The times delivered is
-- left as it is. Returns how many were still held.
local group, me, target, idle = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local done = 0
for i = 1, #KEYS do
  local a = 5 + (i - 1) * 2
  if held(KEYS[i], group, me, ARGV[a], ARGV[a + 1]) then
    redis.call('XCLAIM', KEYS[i], group, target, 0, ARGV[a], 'IDLE', idle, 'JUSTID')
    done = done + 1
  end
end
return done
"""
)

DUE = (
    _HELPERS
    + """
-- KEYS: the delayed set. ARGV: how many to move at most. Moves the due messages back onto
-- their streams, in order. Returns {moved, ms until the next is due (-1: none)}.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms(), 'LIMIT', 0,
                       tonumber(ARGV[1]))
for _, member in ipairs(due) do
  local ok, message = pcall(cjson.decode, member)
  if ok then
    for _, e in ipairs(message.e) do add(e[1], e[2], e[3], e[4]) end
  end
  redis.call('ZREM', KEYS[1], member)
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local wait = -1
if first[2] then wait = math.max(0, tonumber(first[2]) - now_ms()) end
return {#due, wait}
"""
)

CLAIM_PARTITIONS = """
-- KEYS: n lock keys, then the n partition streams. ARGV: me, lock ms, group, the consumer
-- name for handed-back entries, its idle ms. Returns 0, or the index of a partition held
-- by another consumer (nothing is claimed then). The entries a previous owner left
-- pending are marked expired, for the new owner's first sweep.
local me, ttl, group, parked, idle = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local n = #KEYS / 2
for i = 1, n do
  local v = redis.call('GET', KEYS[i])
  if v and v ~= me then return i end
end
for i = 1, n do
  redis.call('SET', KEYS[i], me, 'PX', ttl)
  local stream = KEYS[n + i]
  pcall(redis.call, 'XGROUP', 'CREATE', stream, group, '0', 'MKSTREAM')
  local start = '-'
  for _ = 1, 1000 do
    local p = redis.call('XPENDING', stream, group, start, '+', 500)
    if #p == 0 then break end
    local args = {'XCLAIM', stream, group, parked, 0}
    for _, e in ipairs(p) do args[#args + 1] = e[1] end
    args[#args + 1] = 'IDLE'; args[#args + 1] = idle; args[#args + 1] = 'JUSTID'
    redis.call(unpack(args))
    start = '(' .. p[#p][1]
  end
end
return 0
"""

RENEW_PARTITIONS = """
-- KEYS: lock keys. ARGV: me, lock ms. Returns 0, or the index of one another consumer took.
for i = 1, #KEYS do
  local v = redis.call('GET', KEYS[i])
  if v == ARGV[1] then redis.call('PEXPIRE', KEYS[i], ARGV[2])
  elseif not v then redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
  else return i end
end
return 0
"""

RELEASE = """
-- KEYS: lock keys, then streams. ARGV: me, group, how many lock keys. Drops my locks and,
-- on each stream where I hold nothing, my consumer.
local n = tonumber(ARGV[3])
for i = 1, n do
  if redis.call('GET', KEYS[i]) == ARGV[1] then redis.call('DEL', KEYS[i]) end
end
for i = n + 1, #KEYS do
  local ok, p = pcall(redis.call, 'XPENDING', KEYS[i], ARGV[2], '-', '+', 1, ARGV[1])
  if ok and #p == 0 then
    pcall(redis.call, 'XGROUP', 'DELCONSUMER', KEYS[i], ARGV[2], ARGV[1])
  end
end
return 0
"""

QUEUE_STATS = (
    _HELPERS
    + """
-- KEYS: the readers set, then task streams. ARGV: group. Returns {server ms, the live
-- readers' members, per stream {waiting, held, oldest id or ''}}: waiting is XLEN less
-- the pending entries (an acknowledged entry is deleted), the oldest waiting entry the
-- first after the group's last delivered id.
local group = ARGV[1]
local now = now_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local readers = redis.call('ZRANGE', KEYS[1], 0, -1)
local out = {}
for i = 2, #KEYS do
  local stream = KEYS[i]
  local length = redis.call('XLEN', stream)
  local held, after = 0, '-'
  local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', stream)
  if ok then
    for _, g in ipairs(groups) do
      local info = {}
      for j = 1, #g, 2 do info[g[j]] = g[j + 1] end
      if info['name'] == group then
        held = tonumber(info['pending'])
        after = '(' .. info['last-delivered-id']
      end
    end
  end
  local first = redis.call('XRANGE', stream, after, '+', 'COUNT', 1)
  local oldest = ''
  if first[1] then oldest = first[1][1] end
  out[#out + 1] = {math.max(0, length - held), held, oldest}
end
return {now, readers, out}
"""
)

ANNOUNCE = (
    _HELPERS
    + """
-- KEYS: the readers set, the beats set, the beat records. ARGV: ms a member lives, ms a
-- beat is kept, the reader ('' for one with no worker name), its record, then the
-- members. A named reader's beat is scored with this time; beats older than kept go.
local now = now_ms()
local due = now + tonumber(ARGV[1])
for i = 5, #ARGV do redis.call('ZADD', KEYS[1], due, ARGV[i]) end
if ARGV[3] ~= '' then
  redis.call('ZADD', KEYS[2], now, ARGV[3])
  redis.call('HSET', KEYS[3], ARGV[3], ARGV[4])
  local before = now - tonumber(ARGV[2])
  local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', before, 'LIMIT', 0, 100)
  if #old > 0 then
    redis.call('ZREM', KEYS[2], unpack(old))
    redis.call('HDEL', KEYS[3], unpack(old))
  end
end
return 0
"""
)

BEATS = (
    _HELPERS
    + """
-- KEYS: the readers set, the beats set, the beat records. Returns {the live readers'
-- members, {reader, beat ms, record or ''} for each beat}.
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now_ms(), '+inf')
local beats = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
local out = {}
for i = 1, #beats, 2 do
  out[#out + 1] = {beats[i], beats[i + 1], redis.call('HGET', KEYS[3], beats[i]) or ''}
end
return {live, out}
"""
)

SCRIPTS = {
    "take_tasks": TAKE_TASKS,
    "take_events": TAKE_EVENTS,
    "settle": SETTLE,
    "touch": TOUCH,
    "due": DUE,
    "claim_partitions": CLAIM_PARTITIONS,
    "renew_partitions": RENEW_PARTITIONS,
    "release": RELEASE,
    "queue_stats": QUEUE_STATS,
    "announce": ANNOUNCE,
    "beats": BEATS,
}
"""Every script by the name ``RedisBus.script`` calls it by."""
