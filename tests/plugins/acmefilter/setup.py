# The seed's example plugin package (000_8c74efd2c4995899.txt), pointed at Berth's
# entry-point groups instead of Nova's.
from setuptools import setup

setup(
    name='acmefilter',
    version='0.1',
    description='My custom filter',
    packages=[
        'acmefilter'
    ],
    entry_points={
        'berth.filters': [
            'acme = acmefilter:AcmeFilter',
        ],
        'berth.extra_spec_validators': [
            'acme = acmefilter.validators',
        ],
    },
)
