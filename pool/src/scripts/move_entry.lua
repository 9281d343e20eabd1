-- Moves one inbox entry to another inbox atomically (forwarding, and
-- requeue of a dead worker's unprocessed events).
-- KEYS: base, 9 source inbox, 10 target inbox, 11 cleanup hash
-- ARGV: base, 4 entry id, 5 event name, 6 new payload, 7 target worker,
--       8 maxlen
-- Returns 'ok' | 'no_target' | 'gone'
if redis.call('HEXISTS', WORKERS[1], ARGV[7]) == 0 or redis.call('HEXISTS', KEYS[11], ARGV[7]) == 1 then
  return 'no_target'
end
if redis.call('XDEL', KEYS[9], ARGV[4]) == 0 then
  return 'gone'
end
stream_add(KEYS[10], ARGV[5], ARGV[6], tonumber(ARGV[8]))
return 'ok'
