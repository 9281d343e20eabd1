-- One step of the orphan sweep (run by the pool's elected sweeper): a page
-- of the payloads hash (HSCAN cursor), each key checked against Redis's
-- current state. An orphan is a payload with no pending dispatch and
-- either no owner record or a record naming a worker that is not
-- registered. A key is reported due only once it has been seen orphaned,
-- in the same state (record and fencing token), for at least the grace
-- period on server time: its first sighting leaves a mark
-- "<since_ms> <record or '-'> <token>" in the marks hash, and a key seen
-- not orphaned loses its mark. So a job between two dispatch steps, or a
-- worker about to re-register and re-assert, is never requeued early, and
-- a sweeper that takes over from another one keeps the marks it left.
-- The same step checks a page of the marks hash the same way (a marked
-- key is due at the first step past its grace, not when the pass over the
-- payloads comes back to it; scripts that make an orphan mark it at once)
-- and drops the marks of keys whose payload is gone. Nothing is requeued
-- here: the caller picks the target on its ring and `requeue_orphan.lua`
-- checks everything again.
-- KEYS: base, 9 orphan marks hash, 10 keep-alive revision (`went_back`)
-- ARGV: base, 4 payloads cursor, 5 marks cursor, 6 page size (HSCAN COUNT),
--       7 grace ms, 8 worker ttl ms (the recovery window after a data
--       loss), 9 the revisions the caller has seen (`went_back`), 10 the
--       least server time (ms) it can be now by the caller's own clock:
--       the grace is judged by the smaller of that and `TIME`, so a step
--       of the server's clock does not end it early (`server_clock.rs`)
-- Returns {payloads cursor, marks cursor, marks set (a count), key 1,
-- record 1 ('-': none), ...} for the due orphans (none while the pool
-- recovers from a data loss). The count of marks this step set (first
-- sightings, or a changed state) tells the sweeper a pass has orphans to
-- find: it then takes the next step at once rather than an interval later.
-- Not while the pool recovers: nothing is due then, and steps one after
-- the other would take Redis from the workers' re-assertions.
local MARKS = KEYS[9]
local count, grace, ttl = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local now = now_ms()
local judged = math.min(now, tonumber(ARGV[10]) or now)
local paused = went_back(ARGV[9], ttl, KEYS[10]) or recovering(ttl)

-- Keys only where the server has HSCAN NOVALUES (Redis 7.4); the values
-- (payloads) otherwise come along and are skipped.
local page = redis.pcall('HSCAN', PAYLOADS, ARGV[4], 'COUNT', count, 'NOVALUES')
local stride = 1
if page.err then
  page = redis.call('HSCAN', PAYLOADS, ARGV[4], 'COUNT', count)
  stride = 2
end

local registered = {}
local function is_registered(worker)
  if registered[worker] == nil then
    registered[worker] = redis.call('HEXISTS', WORKERS[1], worker) == 1
  end
  return registered[worker]
end

-- The page's keys, and their records read in chunks (one HMGET per
-- chunk rather than one call per key; a chunk stays far below what
-- `unpack` can take).
local fields = page[2]
local keys = {}
for i = 1, #fields, stride do keys[#keys + 1] = fields[i] end
local records = {}
for first = 1, #keys, 1000 do
  local last = math.min(first + 999, #keys)
  local chunk = redis.call('HMGET', JOBS[1], unpack(keys, first, last))
  for i = 1, #chunk do records[first + i - 1] = chunk[i] end
end

-- The orphan state of a key ('-' or its record), or nil when not an
-- orphan. A record that does not parse is not an orphan (cleanup reports
-- it). Most keys have a live owner and cost no further call.
local function orphan_state(key, record)
  local state = '-'
  if record then
    local owner = string.match(record, '^(%S+) %d+$')
    if (not owner) or is_registered(owner) then return nil end
    state = record
  end
  if redis.call('HEXISTS', PENDING[1], key) == 1 then return nil end
  return state
end

local marked = redis.call('HLEN', MARKS) > 0
local reply = {page[1], '0', 0}
local checked = {}
-- Marks `key` (its record: `record`) on a first sighting as an orphan,
-- drops its mark when it is none, and reports it when due. `mark` is its
-- mark when the caller already read it (the marks page), else nil.
local function check(key, record, mark)
  checked[key] = true
  local state = orphan_state(key, record)
  if state then
    local seen = state .. ' ' .. (redis.call('HGET', FENCING, key) or '0')
    mark = mark or (marked and redis.call('HGET', MARKS, key))
    local since, what = nil, nil
    if mark then since, what = string.match(mark, '^(%d+) (.*)$') end
    if what ~= seen then
      redis.call('HSET', MARKS, key, string.format('%d ', now) .. seen)
      marked = true
      if not paused then reply[3] = reply[3] + 1 end
    elseif (not paused) and judged - tonumber(since) >= grace then
      reply[#reply + 1] = key
      reply[#reply + 1] = state
    end
  elseif marked then
    redis.call('HDEL', MARKS, key)
  end
end
for i = 1, #keys do check(keys[i], records[i] or nil) end

-- A page of the marks, checked as well: a marked key is due one grace
-- after its mark at the next step, wherever the pass over the payloads
-- is (marks are few: orphans only). A mark whose payload is gone goes.
if marked then
  local marks = redis.call('HSCAN', MARKS, ARGV[5], 'COUNT', count)
  reply[2] = marks[1]
  local listed = marks[2]
  for i = 1, #listed, 2 do
    local key = listed[i]
    if redis.call('HEXISTS', PAYLOADS, key) == 0 then
      redis.call('HDEL', MARKS, key)
    elseif not checked[key] then
      check(key, mget(JOBS, key), listed[i + 1])
    end
  end
end
return reply
