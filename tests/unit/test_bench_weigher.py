"""How bench/bench_weigher.py reads nova-scheduler's DEBUG log.

The lines are nova-scheduler's own format (oslo.log's DEBUG suffix
included); the bench is loaded from its file (``bench/`` is not a
package).
"""

import importlib.util
import os

import fixtures
import testtools

_PATH = os.path.join(os.path.dirname(__file__), '..', '..', 'bench',
                     'bench_weigher.py')
_SPEC = importlib.util.spec_from_file_location('bench_weigher', _PATH)
weigher = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(weigher)

A = '0f7ec527-85e7-4c76-8a85-e26e3541a4a5'
B = '9c5fc57a-829f-427a-9556-961a4dac7fa4'


def line(req, text, where='manager'):
    return ('2026-11-28 13:35:40.100 11054 DEBUG nova.%s [None %s e09 4fa '
            '- - default default] %s fn /x.py:1\n' % (where, req, text))


def scores(name, **hosts):
    return line('req-%s' % name[0], '%s: score (multiplier * weight) {%s}' % (
        name[1], ', '.join("('%s', '%s'): '%s'" % (h, h, v)
                           for h, v in hosts.items())), 'weights')


class TestSchedulerDecisions(testtools.TestCase):

    def test_each_request_gives_its_scores_and_host(self):
        ra, rb = ('1111aaaa-0000-0000-0000-000000000000',
                  '2222bbbb-0000-0000-0000-000000000000')
        text = [
            line('req-' + ra, "Starting to schedule for instances: "
                 "['%s'] select_destinations" % A),
            line('req-' + rb, "Starting to schedule for instances: "
                 "['%s']" % B),
            # interleaved requests, told apart by their request ids
            scores((ra, 'RAMWeigher'), c1='1.0 * 1.0', c2='1.0 * 0.0'),
            scores((rb, 'VmarWeigher'), c1='5.0 * 0.0', c2='5.0 * 0.0'),
            scores((ra, 'VmarWeigher'), c1='5.0 * 0.0', c2='5.0 * 0.5'),
            line('req-' + ra, '[instance: %s] Selected host: (c2, c2) '
                 'ram: 1000MB' % A),
            line('req-' + rb, '[instance: %s] Selected host: (c1, c1) '
                 'ram: 1000MB' % B),
            'a line of no request\n',
        ]
        path = os.path.join(self.useFixture(fixtures.TempDir()).path, 'l')
        with open(path, 'w') as f:
            f.write('an older run\n')
            offset = f.tell()
            f.writelines(text)

        got = weigher.scheduler_decisions(path, offset)

        self.assertEqual({
            A: {'host': 'c2', 'scores': {
                'RAMWeigher': {'c1': 1.0, 'c2': 0.0},
                'VmarWeigher': {'c1': 0.0, 'c2': 2.5}}},
            B: {'host': 'c1', 'scores': {
                'VmarWeigher': {'c1': 0.0, 'c2': 0.0}}}}, got)
        self.assertEqual(
            '    #0  image 3 -> c2; c1 vmar 0.00 other +1.00, '
            'c2 vmar 2.50 other +0.00', weigher.decision_line(0, 3, got[A]))
