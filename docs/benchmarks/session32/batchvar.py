"""Run `vggserve batch` with the device decoder's THREADS / GROUP / STARVE_BELOW set: batchvar.py THREADS GROUP STARVE -- batch args"""
import sys
import vggserve.decoding.device.chunks as c
threads, group, starve = map(int, sys.argv[1:4])
c.THREADS, c.STARVE_BELOW = threads, starve
d = list(c.DeviceChunkDecoder.__init__.__defaults__)
d[0] = group
c.DeviceChunkDecoder.__init__.__defaults__ = tuple(d)
import vggserve.decoding.groups as g
g.GROUP = group
import vggserve
print("vggserve from", vggserve.__file__, file=sys.stderr)
from vggserve.cli import main
sys.exit(main(sys.argv[5:]))
