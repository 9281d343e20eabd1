-- Flotilla rmap prelude: replicated writes on a map, for any script that
-- changes one (flotilla_rmap::lua::PRELUDE). Prepend it to the script; every
-- function is `local` (no globals). A map is three names from MapKeys:
-- hash_key (the content), rev_key (the revision counter) and channel (the
-- sharded pub/sub channel); pass all three, and put them in KEYS so the
-- script is routed to their slot on Redis Cluster.
--
-- Wire format of one change, published with SPUBLISH:
--   "<revision>:<op>:<byte length of field>:<field><value>"
-- op: s = set (value follows), d = delete, r = reset (all fields gone),
--     m = a batch of sets and deletes (field = their count, see rmap_batch),
--     y = sync marker of a replica's snapshot (field = token, no revision bump).
--     An upper-case S, D, R or M is the first change of a new revision sequence
--     (the revision key did not exist): it follows revision 0.

-- The revision the caller's replica has applied (0: unknown). A map's own
-- write scripts set it first (rmap_floor(ARGV[3])); other crates' scripts
-- leave it at 0.
local rmap_rev_floor = 0

-- Sets the revision floor for the rest of this script.
local function rmap_floor(rev)
  rmap_rev_floor = tonumber(rev) or 0
end

-- The decimal text of a length, formatted once per script run: Lua's own
-- number-to-text conversion (`..` on a number) goes through "%.14g",
-- dearer than "%d", and the lengths of a batch's fields and values repeat.
local rmap_decimals = {}
local function rmap_dec(n)
  local text = rmap_decimals[n]
  if not text then
    text = string.format('%d', n)
    rmap_decimals[n] = text
  end
  return text
end

-- Resets the state above to what a fresh run starts with. For a prelude
-- loaded once into a Redis function library, whose top level runs at load
-- and whose functions run many times: call it first in every function.
local function rmap_begin()
  rmap_rev_floor = 0
  rmap_decimals = {}
end

-- Bumps the revision of the map and returns it, with whether it starts a
-- new sequence. A revision key that does not exist yet (new map, destroyed
-- map, expired keys, Redis restarted without persistence) starts at the
-- server time in microseconds, so revisions never go backwards across such
-- a loss and replicas see a gap and resync instead of mistaking new writes
-- for old. A revision at or below the caller's replica revision means
-- Redis went back in time (restarted from an older snapshot, a replica
-- promoted with lost writes): the sequence restarts above both the floor
-- and the server time, so the new write never passes for one the replica
-- already has (a `set_and_wait` would return before the replica shows it).
local function rmap_next_rev(rev_key)
  local rev = redis.call('INCR', rev_key)
  if rev == 1 or rev <= rmap_rev_floor then
    local t = redis.call('TIME')
    rev = math.max(tonumber(t[1]) * 1000000 + tonumber(t[2]), rmap_rev_floor + 1)
    redis.call('SET', rev_key, string.format('%d', rev))
    return rev, true
  end
  return rev, false
end

-- Bumps the revision and announces one change. Returns the new revision.
local function rmap_publish(rev_key, channel, op, field, value)
  local rev, first = rmap_next_rev(rev_key)
  if first then
    op = string.upper(op) -- "first revision of a new sequence"
  end
  redis.call('SPUBLISH', channel, string.format('%d', rev) .. ':' .. op .. ':' .. rmap_dec(#field) .. ':' .. field .. value)
  return rev
end

-- Sets field to value (a string), bumps the revision and announces it.
-- Returns the new revision.
local function rmap_set(hash_key, rev_key, channel, field, value)
  redis.call('HSET', hash_key, field, value)
  return rmap_publish(rev_key, channel, 's', field, value)
end

-- Deletes field if present; only then bumps the revision and announces it.
-- Returns 1 if the field was deleted, else 0.
local function rmap_del(hash_key, rev_key, channel, field)
  if redis.call('HDEL', hash_key, field) == 0 then
    return 0
  end
  rmap_publish(rev_key, channel, 'd', field, '')
  return 1
end

-- Deletes every field (the whole hash), bumps the revision and announces it.
-- Returns the new revision.
local function rmap_reset(hash_key, rev_key, channel)
  redis.call('DEL', hash_key)
  return rmap_publish(rev_key, channel, 'r', '', '')
end

-- A batch of changes to one map made by one script, announced as one
-- revision and one message when flushed (many changes, one INCR and one
-- SPUBLISH). The hash changes at once, so the script reads its own writes.
-- Wire format: the field of an 'm' message is the number of changes, its
-- value the changes, each
--   "<op>:<byte length of field>:<field><byte length of value>:<value>"
-- with op s (set) or d (delete, empty value).
-- The message is built only while someone listens on the map's channel,
-- asked once per batch at its first change (`PUBSUB SHARDNUMSUB`): a
-- script runs alone, so the answer holds until the flush, and whoever
-- subscribes later reads the map after subscribing (a replica subscribes,
-- then snapshots), so it sees the change there. The revision moves either
-- way: replicas and the pool's checks compare revisions, not messages.
local function rmap_batch(hash_key, rev_key, channel)
  return {hash_key = hash_key, rev_key = rev_key, channel = channel, parts = {}, changes = 0}
end

-- Counts a change; returns whether its part of the message is wanted.
local function rmap_batch_count(batch)
  if batch.listened == nil then
    batch.listened = redis.call('PUBSUB', 'SHARDNUMSUB', batch.channel)[2] > 0
  end
  batch.changes = batch.changes + 1
  return batch.listened
end

-- Asks once, for batches a call is about to change, whether anyone listens
-- to each one's channel: one PUBSUB SHARDNUMSUB for all of them instead of
-- one per batch at its first change.
local function rmap_batch_listen(...)
  local batches = {...}
  local channels = {}
  for i, batch in ipairs(batches) do
    channels[i] = batch.channel
  end
  local counts = redis.call('PUBSUB', 'SHARDNUMSUB', unpack(channels))
  for i, batch in ipairs(batches) do
    batch.listened = counts[2 * i] > 0
  end
end

-- Adds a set of field to value to the batch's message.
local function rmap_batch_note_set(batch, field, value)
  if rmap_batch_count(batch) then
    batch.parts[#batch.parts + 1] = 's:' .. rmap_dec(#field) .. ':' .. field .. rmap_dec(#value) .. ':' .. value
  end
end

-- Sets field to value in the batch's map.
local function rmap_batch_set(batch, field, value)
  redis.call('HSET', batch.hash_key, field, value)
  rmap_batch_note_set(batch, field, value)
end

-- Sets field to value only if the field does not exist. Returns 1 if it
-- was set, else 0 (nothing changed).
local function rmap_batch_set_nx(batch, field, value)
  if redis.call('HSETNX', batch.hash_key, field, value) == 0 then
    return 0
  end
  rmap_batch_note_set(batch, field, value)
  return 1
end

-- Deletes field if present. Returns 1 if the field was deleted, else 0.
local function rmap_batch_del(batch, field)
  if redis.call('HDEL', batch.hash_key, field) == 0 then
    return 0
  end
  if rmap_batch_count(batch) then
    batch.parts[#batch.parts + 1] = 'd:' .. rmap_dec(#field) .. ':' .. field .. '0:'
  end
  return 1
end

-- Announces the batch's changes, if any (to listeners, if any). Returns
-- the new revision, or false when nothing changed.
local function rmap_batch_flush(batch)
  local n = batch.changes
  if n == 0 then
    return false
  end
  local rev
  if batch.listened then
    rev = rmap_publish(batch.rev_key, batch.channel, 'm', rmap_dec(n), table.concat(batch.parts))
  else
    rev = rmap_next_rev(batch.rev_key)
  end
  batch.parts = {}
  batch.changes = 0
  return rev
end

-- Applies a map's TTL option after a write. mode: '' = none,
-- 'a' = absolute (set only when the key has no expiry), 's' = sliding.
local function rmap_ttl(hash_key, rev_key, mode, ms)
  if mode == 's' then
    redis.call('PEXPIRE', hash_key, ms)
    redis.call('PEXPIRE', rev_key, ms)
  elseif mode == 'a' then
    if redis.call('PTTL', hash_key) == -1 then
      redis.call('PEXPIRE', hash_key, ms)
    end
    if redis.call('PTTL', rev_key) == -1 then
      redis.call('PEXPIRE', rev_key, ms)
    end
  end
end

-- Decodes a list value (a JSON array of strings). Returns the table, or nil
-- and a reason. The work is bounded by the value's own size.
local function rmap_decode_list(value)
  local ok, list = pcall(cjson.decode, value)
  if not ok or type(list) ~= 'table' then
    return nil, 'not a JSON array'
  end
  local n = 0
  for k, v in pairs(list) do
    if type(k) ~= 'number' or type(v) ~= 'string' then
      return nil, 'not a JSON array of strings'
    end
    n = n + 1
  end
  if n ~= #list then
    return nil, 'not a JSON array'
  end
  return list
end
